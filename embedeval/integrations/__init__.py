"""Optional integrations with training frameworks (each imports its framework on first use)."""
