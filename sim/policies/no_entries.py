"""``NONE``: the read-only empty list a ``StepPlan`` list field (sim/policies/base.py) starts as.

Why: a module of its own, outside the compiled core (sim/compiled_core.py): mypyc compiles no
subclass of ``list``.
"""


class _NoEntries(list):
    """The empty list that a ``StepPlan`` list field shares with every other plan until its first
    entry (most rounds leave most fields empty; eight new lists per round were a measurable
    share of a step's CPU). Read-only: the scheduler assigns the field a new list before
    appending. Hashable by identity only so that dataclasses accept it as a default (they
    take unhashable defaults for mutable ones; this one cannot change)."""

    __slots__ = ()
    __hash__ = object.__hash__

    def _read_only(self, *args, **kwargs):
        raise TypeError("a StepPlan field's shared empty list is read-only: assign a new list")

    append = extend = insert = pop = remove = clear = sort = reverse = _read_only
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only


NONE = _NoEntries()
