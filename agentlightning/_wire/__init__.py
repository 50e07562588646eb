"""The OpenAI wire format shared by capture, the proxy, the mock server and the backends (private)."""
