"""Deprecated forwarders for the pre-0.20 attention API, the legacy-backend adapter and the vLLM plugin."""
