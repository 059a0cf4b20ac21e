"""The host's health while we time: other processes' CPU use, memory speed, disturbance signs."""
