"""Model repository: layout scan, config parsing, and the model manager."""
