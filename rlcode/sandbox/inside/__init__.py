"""Code that runs INSIDE the sandbox, next to candidate code. Nothing here is trusted by the parent.

What may live here: the worker's main loop (worker_main.py) and its line protocol (protocol_lines.py), the child harness that confines itself
and runs one program (child_harness.py), killing an execution's process tree (process_tree.py),
reading an execution's outcome (outcome.py) and the plain-data encoder (plain_encode.py).

Rules for this folder:
  * stdlib only, no ``rlcode`` imports: the worker runs the base interpreter with ``-I -S`` from a
    private copy of these files (``rlcode.sandbox.launch.WORKER_FILES``), loaded by path, so its
    sibling imports are plain ``import outcome``; this package's ``__init__`` never runs there;
  * everything it produces (result lines, probe values, status lines) is untrusted input to the
    parent: candidate code shares the child's process and can write the values pipe;
  * nothing here decides a verdict; the parent does (``rlcode.sandbox.verdict``).
"""
