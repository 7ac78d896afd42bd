"""Stepping an asyncio loop in tests without letting time pass."""

from __future__ import annotations

import asyncio


async def settle(rounds: int = 20) -> None:
    """Give every ready task `rounds` turns of the loop: each runs until it blocks. No time passes.

    A test that asserts something did NOT happen calls this first: the task that would have done it has had
    its turns (proof that it ran), which a sleep of some milliseconds does not give on a loaded machine.
    """
    for _ in range(rounds):
        await asyncio.sleep(0)
