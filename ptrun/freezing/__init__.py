"""Progressive freezing, PipeTransformer's first automatic part: how many leading blocks to freeze at each
decision. `policy.py` is a policy's contract (when it decides, what it reads, the registry by name),
`policies.py` the closed forms and `make_policy`, `measured_policies.py` the policies that read a per-block
measure, `measures.py` that measure as a worker takes it, and `counts.py` the arithmetic between blocks and
units. Below `auto/`, which runs the policy, and above the runtime, which it never imports."""
