"""An independent reference model of ``limitflow replay`` and a generator of cases for it.

Both were written from the contract (the issue that specified the decision core and
``limitflow replay``, plus what the README adds about parsing), never from limitflow's
code, so that a misreading in the code does not reappear in the model: ``model`` decides
a file of event lines as the contract says, ``generate`` makes random rules files and
event streams aimed at the edges (DST and odd-offset zones, period boundaries, JPY, CNY
and KWD amounts, limits of 0, exact-at-limit, scope lists, ``match``, reversals of every
outcome, resends reformatted or changed, invalid lines). ``tests/unit/test_oracle.py``
runs the product on them and compares (also with the rules changed in place and back
between replays on one store, as the README's *Changing rules* allows); the store
contract runs four of its fixed cases on every store, and two more and a fresh one on a
store clock that moves between batches (the model keeps retention when asked, as the
README's *State stores* says), and the integration tests one through ``limitflow run``
and the faust app.

What the contract leaves to limitflow came later and from the other side: the verdict's
``limits`` explanation, and its ``occurred_at``, ``amount``, ``currency`` and
``original_event_id`` (README, *Verdicts*), and a reversal in another currency than its
original's or finer than the original's currency (README, *Reversals*). The README's
words there were written from the code, and the model checks that the code keeps to
them (``rules_version`` is checked against ``limitflow rules check``, and
``--dry-run`` against a replay, in ``test_oracle``).
"""
