"""The Qwen3 model built from its config, and the device it runs on."""
