"""The backend for a model behind an OpenAI-compatible server, and its HTTP client."""
