"""Triton kernels, each beside its plain-PyTorch reference (STYLE.md rule 5).

Every kernel here is batch invariant: the result for one row (a token, a query) depends
only on that row's inputs, bitwise, never on how many other rows share the launch or what
they hold. That is what lets every mode serve exactly the ar tokens in bf16 on a GPU
(issue: exact greedy in bf16): an ar step (1 row), a chain verify (1+L rows) and a tree
verify of several requests (B x (1+N) rows) do the same arithmetic for the same token.

On a machine without a GPU the kernels run under `TRITON_INTERPRET=1` (the tests set it);
the models call the references on the CPU.
"""
