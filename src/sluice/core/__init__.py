"""What is serving now and the one request path: the registry of models and versions, traffic
splits, serving, validation, the response cache, shared-memory regions and statistics."""
