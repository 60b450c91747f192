"""Migrating one file: the rule base class and its docs, one libcst parse, the one walk with its scopes, the
edits and their application, the safety checks. Knows nothing of folders, processes or other files, except
through the index (`codemods.index`) it is handed."""
