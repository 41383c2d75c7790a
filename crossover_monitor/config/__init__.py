"""The configuration: the settings types and their converters (stdlib only: the worker imports them), the YAML
reader (``loader``), the one YAML parser's wrapper and the JSON Schema. Nothing here imports the service, HTTP or a
framework."""
