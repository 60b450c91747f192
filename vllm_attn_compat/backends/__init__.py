"""The mandatory-output attention contract of vLLM >= 0.20, implemented without vLLM."""
