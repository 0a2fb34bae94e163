"""Script calls: by hash with a fallback, with a durable write's ``WAIT``, and by id with the retry that finds
packed messages where the packed index says they are."""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.exceptions import RedisClusterException

from .. import packing, scripts
from ..connect import AnyRedis
from ..errors import DelayBrokerError, StoreUnavailable
from ..keys import Keyspace
from ..packing import NOT_PACKABLE, NOWHERE, SPLIT_AT, IndexReshaped, IndexShape, Location, PackedElsewhere, binary_id
from ..redis_errors import slot_moving
from .migration import BRIEF_WAIT, waited_out
from .replication import Replication
from .replies import MAX_BATCH, text
from .shards import ClusterFailure, RedisFailure, Shards

logger = logging.getLogger("delay_broker.store")

NEW_INDEX = IndexShape()
"""The packed index's shape until a store sees another: one partition."""
PACK_CALLS = 10
"""Calls a by-id script is given to find the ids where the packed index says they are (see :meth:`Runner.by_id`)."""


class Runner:
    """Runs the store's scripts on its shards: each gets the keys it names (``scripts.keys_used``) and the call's
    own; a write waits for the replicas the store asks for; errors come out as delay_broker's."""

    def __init__(self, shards: Shards, replication: Replication) -> None:
        self.shards = shards
        self.replication = replication
        client: AnyRedis = shards.client
        self._scripts = {name: client.register_script(scripts.source(name)) for name in scripts.NAMES}
        self._shapes: dict[int, IndexShape] = {}
        """Per shard, the shape of the packed index as last seen (scripts refuse a stale one that matters)."""

    def run(
        self,
        name: str,
        shard: int,
        args: Sequence[Any],
        *,
        extra: Sequence[str] = (),
        write: bool = True,
        replicas: int | None = None,
        migration_wait: float | None = None,
    ) -> Any:
        """Script ``name`` on a shard; a write waits for ``replicas`` (by default the store's) to confirm it. While
        the shard's slot migrates between Cluster nodes the script is refused before it runs, and is made again
        for up to ``migration_wait`` seconds (by default :data:`~.migration.MIGRATION_WAIT`; see
        :mod:`~delay_broker.store.migration`)."""
        space = self.shards.space(shard, name)
        keys = [*space.keys_of(scripts.keys_used(name)), *extra]
        if self.shards.cluster:
            keys.append(space.guard)
        replicas = (self.replication.replicas if replicas is None else replicas) if write else 0
        try:  # as Shards.redis() does, without a context manager's cost on every call
            return self._call(name, space, keys, args, replicas)
        except ClusterFailure as error:
            if not (self.shards.cluster and slot_moving(error)):
                if isinstance(error, AttributeError):
                    raise
                raise self._refusal(error, name) from error
            refused = error
        doing = f"{name} on shard {shard} ({space.due})"
        try:
            return waited_out(lambda: self._call(name, space, keys, args, replicas), refused, migration_wait, doing)
        except RedisFailure as error:
            raise self._refusal(error, name) from error

    def _call(self, name: str, space: Keyspace, keys: Sequence[str], args: Sequence[Any], replicas: int) -> Any:
        if replicas:
            return self.replication.write(
                name, space, lambda pipe: self._scripts[name](keys=keys, args=args, client=pipe), replicas
            )
        return self._evalsha(name, keys, args)

    def _refusal(self, error: redis.RedisError | RedisClusterException, name: str) -> Exception:
        """A failure of script ``name`` as delay_broker's: where the ids are packed, or what Redis said."""
        elsewhere = packing.packed_elsewhere(error) if isinstance(error, redis.ResponseError) else None
        return elsewhere if elsewhere is not None else self.shards.translated(error, name)

    def run_together(self, calls: Sequence[tuple[str, int, Sequence[Any], Sequence[str]]]) -> list[Any]:
        """Calls ``(name, shard, args, extra)`` of one server in one round trip, each one's reply or its error as
        delay_broker's (for the caller of that call alone). Not on a Cluster, not with replicas: those go one by
        one. A call whose script the server lacks is made again alone (which loads it)."""
        if self.shards.cluster:  # each script needs its slot's guard key and redirects: see run()
            raise ValueError("run_together is for one server, not a Redis Cluster")
        if not calls:
            return []
        pipe = self.shards.client.pipeline(transaction=False)
        for name, shard, args, extra in calls:
            keys = [*self.shards.space(shard, name).keys_of(scripts.keys_used(name)), *extra]
            pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
        try:
            replies = pipe.execute(raise_on_error=False)
        except RedisFailure as error:  # the connection, for every call of the round trip
            raise self.shards.translated(error, calls[0][0]) from error
        results: list[Any] = []
        for (name, shard, args, extra), reply in zip(calls, replies, strict=True):
            if isinstance(reply, redis.exceptions.NoScriptError):
                try:
                    reply = self.run(name, shard, args, extra=extra)
                except DelayBrokerError as error:
                    reply = error
            elif isinstance(reply, RedisFailure):
                reply = self.shards.translated(reply, name)
            results.append(reply)
        return results

    def _evalsha(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Script ``name`` by its hash, sent whole (and so loaded) where the server lacks it. Not through redis-py's
        ``Script``: on a Cluster its fallback loads the script on every primary, which fails while any one is
        down and so held up the healthy shards; and its call adds client time to every park (an import and copies
        of the arguments each time)."""
        client = self.shards.client
        sha = self._scripts[name].sha
        try:
            return client.evalsha(sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            if self.shards.cluster:  # sent whole, it is loaded on the node of its keys only
                return client.eval(scripts.source(name), len(keys), *keys, *args)
            client.script_load(scripts.source(name))  # not EVAL: the least ACL allows only EVALSHA
            return client.evalsha(sha, len(keys), *keys, *args)

    # -- the packed index ------------------------------------------------------------------------------

    def shape(self, shard: int) -> IndexShape:
        return self._shapes.get(shard, NEW_INDEX)

    def reshaped(self, shard: int, shape: IndexShape) -> None:
        self._shapes[shard] = shape

    def partition_key(self, space: Keyspace, shard: int, binary: bytes) -> str:
        """The packed index partition a 16-byte id is in, by the shape last seen (``packs`` for an id never
        packed: a key of the shard that stands for none)."""
        return space.packs if binary == NOT_PACKABLE else space.packed(self.shape(shard).partition(binary))

    def by_id(
        self,
        name: str,
        shard: int,
        ids: Sequence[str],
        args: Sequence[Any],
        *,
        targets: Sequence[str] | None = None,
        write: bool = True,
        replicas: int | None = None,
        binaries: Sequence[bytes] | None = None,
        packed: Sequence[Location | None] | None = None,
    ) -> Any:
        """Script ``name`` on ``ids`` of a shard, told where each is packed (see ``pack_locate`` in the Lua helpers).

        It is first told that none is (or what ``packed`` says, when the caller read it); a script that finds ids
        packed elsewhere writes nothing and says where they are, and is called again with that (a pack opened, or
        an id parked again, in between moves them again); one given an index partition that a split moved an id
        out of says the index's shape, and is called again with the partitions of that. ``targets``: per id, the
        pack a park may append it to (the shard's ``packs`` key for none). ``binaries``: the ids' 16-byte forms,
        when the caller has them."""
        space = self.shards.space(shard, name)
        if binaries is None:
            binaries = [binary_id(id) for id in ids]
        where: list[Location | None] = [None] * len(ids) if packed is None else list(packed)
        for _ in range(PACK_CALLS):
            extra, arguments = self._by_id_arguments(space, shard, args, binaries, where, targets)
            try:
                return self.run(name, shard, arguments, extra=extra, write=write, replicas=replicas)
            except PackedElsewhere as elsewhere:
                for position, location in elsewhere.locations.items():
                    where[position - 1] = location
            except IndexReshaped as reshaped:
                self._shapes[shard] = reshaped.shape
        raise StoreUnavailable(
            f"{name}: the messages kept moving between packs and the ordinary layout over {PACK_CALLS} calls; "
            "doing it again is safe"
        )

    def _by_id_arguments(
        self,
        space: Keyspace,
        shard: int,
        args: Sequence[Any],
        binaries: Sequence[bytes],
        where: Sequence[Location | None],
        targets: Sequence[str] | None,
    ) -> tuple[list[str], list[Any]]:
        """A by-id call's keys after the shard's and its arguments: ``args``, then the trailer (see
        ``by_id_trailer`` in Lua)."""
        shape = self.shape(shard)
        extra, places = self._id_keys(space, shape, binaries, where, targets)
        locations = " ".join(NOWHERE if location is None else str(location) for location in where)
        key_map = struct.pack(f"<{len(places)}H", *places)
        return list(extra), [*args, str(shape), b"".join(binaries), locations, key_map]

    def by_id_call(
        self,
        name: str,
        shard: int,
        ids: Sequence[str],
        args: Sequence[Any],
        *,
        targets: Sequence[str],
        binaries: Sequence[bytes],
    ) -> ByIdCall:
        """:meth:`by_id` in steps, so that a caller builds its next call while the server runs this one: the first
        call's arguments now, then :meth:`ByIdCall.send` and :meth:`ByIdCall.reply`. For a write on one server
        with no replicas to wait for (not a Cluster: see :meth:`run`)."""
        client = self.shards.client
        if not isinstance(client, redis.Redis):  # a Cluster's calls need their slot's guard and redirects: run()
            raise ValueError("by_id_call is for one server, not a Redis Cluster")
        space = self.shards.space(shard, name)
        extra, arguments = self._by_id_arguments(space, shard, args, binaries, [None] * len(ids), targets)
        keys = [*space.keys_of(scripts.keys_used(name)), *extra]
        command = ("EVALSHA", self._scripts[name].sha, len(keys), *keys, *arguments)
        return ByIdCall(lambda: self.by_id(name, shard, ids, args, targets=targets, binaries=binaries), command, client)

    def _id_keys(
        self,
        space: Keyspace,
        shape: IndexShape,
        binaries: Sequence[bytes],
        where: Sequence[Location | None],
        targets: Sequence[str] | None,
    ) -> tuple[dict[str, int], list[int]]:
        """The keys of a by-id call after the shard's, each once (by its place), and each id's places among them:
        its index partition, the pack it is said to be in, and its target pack (see ``id_keys`` in Lua)."""
        packs = space.packs
        extra: dict[str, int] = {packs: 0}
        partitions: dict[int, int] = {}  # partition number -> place: one key string per partition, not per id
        places: list[int] = []
        for n, binary in enumerate(binaries):
            if binary == NOT_PACKABLE:
                places.append(0)
            else:
                number = shape.partition(binary)
                place = partitions.get(number)
                if place is None:
                    place = partitions[number] = extra.setdefault(space.packed(number), len(extra))
                places.append(place)
            location = where[n]
            places.append(0 if location is None else extra.setdefault(space.pack(location.pack), len(extra)))
            if targets is not None:
                places.append(extra.setdefault(targets[n], len(extra)))
        return extra, places

    def split_index(self, shard: int, partition: int, size: int = SPLIT_AT + 1) -> None:
        """Split partitions of the shard's packed index, the next ones in line, up to ``partition``, which a park
        filled past :data:`~.packing.SPLIT_AT` (to ``size`` entries: a batch that filled one several times over
        doubles the index as many times). Best effort: the park is done, and a later one asks again."""
        space = self.shards.spaces[shard]
        try:
            shape = self.shape(shard)
            wanted = shape.splits_to(partition) + (size // SPLIT_AT - 1) * shape.partitions
            while wanted > 0:
                pairs, _ = shape.splits(min(wanted, MAX_BATCH // 2))
                keys = [space.packed(number) for pair in pairs for number in pair]
                args = [str(shape), len(pairs)]
                done, reply = self.run("split_index", shard, args, extra=keys, migration_wait=BRIEF_WAIT)
                shape = self._shapes[shard] = IndexShape.parse(text(reply))
                if not int(done):  # another process split meanwhile: a park asks again if need be
                    return
                wanted -= len(pairs)
        except DelayBrokerError as error:
            logger.debug("Store %r: splitting the packed index failed: %s", self.shards.keys.namespace, error)


class ByIdCall:
    """A by-id script call built now, sent and answered later (:meth:`Runner.by_id_call`): a caller's work between
    :meth:`send` and :meth:`reply` overlaps the server's. It holds a connection of the pool from its send to its
    reply only. Only the script's own answer is taken from the connection; anything else (a refusal, the script
    missing, a lost connection) and the call is made again as :meth:`Runner.by_id` makes it, which follows packed
    ids and says what went wrong as it always does: the scripts write nothing when they refuse, and a park made
    again replaces itself."""

    def __init__(self, again: Callable[[], Any], command: tuple[Any, ...], client: redis.Redis) -> None:
        self._again = again
        self._command = command
        self._pool = client.connection_pool
        self._parse: Callable[..., Any] = client.parse_response
        self._connection: Any = None
        self._unread = False

    def send(self) -> None:
        try:
            try:
                self._connection = self._pool.get_connection()
            except TypeError:  # redis-py before 5.3 asks for the command's name
                self._connection = self._pool.get_connection("EVALSHA")
        except RedisFailure:
            return  # reply() makes the call as by_id does, and says what went wrong
        self._unread = True  # from the first byte sent
        try:
            self._connection.send_command(*self._command)
        except BaseException as error:
            self.close()
            if not isinstance(error, RedisFailure):
                raise  # else reply() makes the call again

    def reply(self) -> Any:
        if self._connection is not None:
            try:
                reply = self._parse(self._connection, "EVALSHA")
            except redis.ResponseError:
                self._unread = False  # read whole: the connection can serve again
            except BaseException as error:
                if not isinstance(error, RedisFailure):
                    self.close()
                    raise
            else:
                self._unread = False
                self.close()
                return reply
            self.close()
        return self._again()

    def close(self) -> None:
        """Give the connection back; one whose answer was not read is dropped, so that no later command reads it."""
        connection, self._connection = self._connection, None
        if connection is not None:
            if self._unread:
                connection.disconnect()
            self._pool.release(connection)
