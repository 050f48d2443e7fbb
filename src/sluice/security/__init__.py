"""Who may call what: access rules, API keys, the audit log and TLS files."""
