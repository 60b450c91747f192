"""The parts of scripts/attention_manifest.py: read one vLLM release's attention interface from its sources with
``ast`` (nothing of vLLM is imported), fold the releases into per-member histories, render the docs.

Standard library only, so the script runs on any interpreter without installing anything.
"""
