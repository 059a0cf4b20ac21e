"""Artifact contracts: schemas, validating readers/writers, run directories and metadata."""
