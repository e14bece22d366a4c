"""The command line: ``rlcode fit|validate|test|export`` (``command.py``) and what it checks before a
run starts or resumes (settings' ranges, resume rules, old config forms, error messages, help)."""
