"""What the service serves over HTTP: the server, its routes and landing page, the web config (TLS, basic auth)."""
