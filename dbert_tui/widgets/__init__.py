"""Self-contained widgets: the token view and the noise-schedule panel."""
