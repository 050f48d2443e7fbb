"""What the server tells operators: metrics, control events and log settings."""
