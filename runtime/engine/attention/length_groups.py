"""Which sequences of one step may share a padded attention call: those of similar context length.

A padded call costs every member as much as its longest context, so a short sequence batched with a
long one (a no-image guidance branch beside a full-context one, a fresh decode beside a long one) pays
for keys it never sees. Sharing a call only pays where the call's fixed cost outweighs the padding.
"""

from __future__ import annotations

# Padding of up to this many query-key pairs per member costs less than one more SDPA call (measured on
# CPU: a call ~10 us, one decode query with 7 heads of 128 over 100 keys about the same).
FREE_PAIRS_PER_SEQUENCE = 64
# A sequence with at least this many query-key pairs runs alone: its call's fixed cost is negligible
# beside its work, and alone it needs no key-padding mask (the masked SDPA path is slower on CPU).
ALONE_PAIRS = 1 << 16
# A shared call may cost at most this much more than its members' own contexts.
PADDING_SLACK = 1.25


def similar_length_groups(
    context_lens: list[int],
    query_len: int,
    slack: float = PADDING_SLACK,
    free_pairs: int = FREE_PAIRS_PER_SEQUENCE,
    alone_pairs: int = ALONE_PAIRS,
) -> list[list[int]]:
    """Partition sequence indices (all with ``query_len`` query rows) into groups for shared calls.

    Returns lists of indices into ``context_lens`` (ascending within a group, so that rows packed in
    order stay in order; the group holding the longest context first); every group's padded
    cost (members x longest context x query_len) stays within ``slack`` x its members' own cost plus
    ``free_pairs`` per member, and a sequence of ``alone_pairs`` or more query-key pairs is a group
    of its own.
    """
    if query_len < 1:
        raise ValueError(f"query_len must be >= 1, got {query_len}")
    order = sorted(range(len(context_lens)), key=lambda i: -context_lens[i])
    groups: list[list[int]] = []
    longest = own = 0  # the open group's longest context and the sum of its members' contexts
    for i in order:
        n = context_lens[i]
        if groups and query_len * longest < alone_pairs:
            members = len(groups[-1]) + 1
            padded = members * longest * query_len
            if padded <= slack * (own + n) * query_len + free_pairs * members:
                groups[-1].append(i)
                own += n
                continue
        groups.append([i])
        longest = own = n
    return [sorted(g) for g in groups]
