"""What the server tells operators: metrics, the dashboard document, control events and log
settings."""
