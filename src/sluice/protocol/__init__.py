"""Pure wire codecs shared by the server and the load generator."""
