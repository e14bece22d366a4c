"""The colocated vLLM backend: engine construction, requests, and pushing the policy's weights."""
