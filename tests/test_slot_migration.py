"""What the store makes of a Redis Cluster slot in migration, as units: which failures prove a call was refused
before it ran, how they are waited out, and what they become (integration/test_store_migration.py and
integration/test_store_rebalance.py run the real thing)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from delay_broker import SlotMigrating, WrongNode
from delay_broker.redis_errors import ask_to_unknown_node, slot_moving, translate
from delay_broker.store import migration


def redis_py_failing_an_ask_to_a_new_master() -> AttributeError:
    """The AttributeError redis-py raises when an ASK names a node its slot map lacks (redis/redis-py#4015): the
    node it looked up is None, and it asks None for its connection."""
    try:
        RedisCluster.get_redis_connection(Any, None)  # type: ignore[arg-type]
    except AttributeError as error:
        return error
    raise AssertionError("redis-py followed an ASK to a node it does not know: the work-around can go")


def test_refusals_before_running_are_told_apart_from_other_failures() -> None:
    assert slot_moving(redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"))
    assert slot_moving(redis.exceptions.AskError("3999 127.0.0.1:7002"))
    assert slot_moving(redis.exceptions.MovedError("3999 127.0.0.1:7002"))
    assert slot_moving(redis.exceptions.ClusterError("TTL exhausted."))
    assert slot_moving(redis_py_failing_an_ask_to_a_new_master())
    # A call that may have run, or a refusal of another kind, is not made again.
    assert not slot_moving(redis.ConnectionError("Connection closed by server."))
    assert not slot_moving(redis.TimeoutError("Timeout reading from socket"))
    assert not slot_moving(redis.ResponseError("Script attempted to access a non local key in a cluster node"))
    assert not slot_moving(redis.exceptions.ClusterDownError("The cluster is down"))
    assert not slot_moving(redis.exceptions.ClusterError("Cluster mode is not enabled on this node"))


def test_only_redis_py_s_own_failure_on_an_ask_is_taken_for_a_slot_moving() -> None:
    assert ask_to_unknown_node(redis_py_failing_an_ask_to_a_new_master())

    def get_redis_connection(node: Any) -> Any:  # the same words, raised by a function of the same name elsewhere
        return node.redis_connection

    with pytest.raises(AttributeError) as caught:
        get_redis_connection(None)
    assert not ask_to_unknown_node(caught.value)
    assert not ask_to_unknown_node(AttributeError("'NoneType' object has no attribute 'redis_connection'"))


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
        redis.exceptions.AskError("3999 127.0.0.1:7002"),
        redis.exceptions.ClusterError("TTL exhausted."),
    ],
)
def test_a_slot_moving_becomes_slot_migrating_a_wrong_node(error: redis.RedisError) -> None:
    translated = translate(error, "park")
    assert isinstance(translated, SlotMigrating) and isinstance(translated, WrongNode)
    assert "migrating" in str(translated) or "moving" in str(translated)


def test_moved_stays_a_wrong_node_a_plain_url_to_one_node_gets() -> None:
    translated = translate(redis.exceptions.MovedError("3999 127.0.0.1:7002"), "park")
    assert isinstance(translated, WrongNode) and not isinstance(translated, SlotMigrating)
    assert "redis+cluster://" in str(translated)


def test_a_refused_call_is_made_again_until_the_slot_has_moved() -> None:
    replies: list[Any] = [redis.exceptions.TryAgainError("rehashing"), redis.exceptions.AskError("1 h:1"), "done"]

    def call() -> str:
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return str(reply)

    refused = redis.exceptions.TryAgainError("rehashing")
    assert migration.waited_out(call, refused, 2.0, "park on shard 1") == "done" and not replies


def test_a_call_refused_longer_than_its_patience_says_so() -> None:
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1
        raise redis.exceptions.TryAgainError("rehashing")

    with pytest.raises(SlotMigrating, match=r"park on shard 1 for 0\.\d s: its slot is migrating.*TRYAGAIN") as caught:
        migration.waited_out(call, redis.exceptions.TryAgainError("rehashing"), 0.2, "park on shard 1")
    assert calls >= 3 and isinstance(caught.value.__cause__, redis.exceptions.TryAgainError)
    with pytest.raises(SlotMigrating):
        migration.waited_out(call, redis.exceptions.AskError("1 h:1"), 0.0, "claim on shard 2")


def test_a_failure_of_another_kind_while_waiting_is_raised_as_it_is() -> None:
    def call() -> None:
        raise redis.ConnectionError("Connection closed by server.")

    with pytest.raises(redis.ConnectionError):
        migration.waited_out(call, redis.exceptions.TryAgainError("rehashing"), 2.0, "ack on shard 0")
