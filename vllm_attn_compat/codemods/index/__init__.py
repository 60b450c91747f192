"""What a run knows across files, from stdlib ``ast`` (and a text scan that spares it): which classes are vLLM
attention classes, which code is patched onto them, and who calls the methods whose fixes the rules decide.
Built in the main process, pickled to the workers, read by the engine."""
