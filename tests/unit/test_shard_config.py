"""Sharding: the [shards] config, its errors, and where queues and jobs are placed."""

import collections

import pytest

from notifyq import config, errors
from notifyq.sharding import placement

TWO = '[shards]\na = "mysql://u:Pa55w0rd@h1:3307/q"\nb = "mysql://u@h2:3308/q"\n'


def load(tmp_path, text="", env=None, overrides=None):
    path = tmp_path / "notifyq.toml"
    path.write_text(text)
    return config.load(env={"NOTIFYQ_CONFIG": str(path), **(env or {})}, overrides=overrides)


def test_shards_table_names_each_server_and_config_masks_their_passwords(tmp_path):
    cfg = load(tmp_path, TWO)
    assert cfg.shard_names() == ("a", "b")
    assert (cfg.shards["a"].port, cfg.shards["a"].password, cfg.shards["b"].port) == (3307, "Pa55w0rd", 3308)
    assert cfg.dsn == cfg.shards["a"]  # the first shard by name: what is no queue's
    shown = cfg.masked_dict()
    assert shown["shards"] == {"a": "mysql://u:***@h1:3307/q", "b": "mysql://u@h2:3308/q"}
    assert "dsn" not in shown and "Pa55w0rd" not in str(shown)
    one = cfg.on_shard("b")
    assert one.dsn == cfg.shards["b"] and one.shards == {} and one.shard_names() == ("",)


def test_shard_may_be_a_galera_cluster_and_have_its_own_password_file(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    cfg = load(tmp_path, f'[shards]\na = "mysql://u@h1:1,h2:2/q"\n'
                         f'b = {{ dsn = "mysql://u@h3/q", password_file = "{secret}" }}\n',
               env={"NOTIFYQ_PASSWORD": "global"})
    assert cfg.shards["a"].servers == (("h1", 1), ("h2", 2)) and cfg.shards["a"].password == "global"
    assert cfg.shards["b"].password == "s3cret"


def test_env_form_keeps_host_lists_whole(tmp_path):
    cfg = load(tmp_path, env={"NOTIFYQ_SHARDS": "a=mysql://u@h1:1,h2:2/q,b=mysql://u@h3:3/q"})
    assert cfg.shards["a"].servers == (("h1", 1), ("h2", 2)) and cfg.shards["b"].port == 3


@pytest.mark.parametrize("text, env, overrides, error", [
    ("[shards]\n", {}, None, "empty [shards]"),
    (TWO + '[queue.x]\nshard = "c"\n', {}, None, "queue.x.shard: unknown shard 'c'"),
    (TWO + '[queue.x]\nshard = "a"\nspread = true\n', {}, None, "queue.x: set shard or spread, not both"),
    ('[queue.x]\nspread = true\n', {}, None, "queue.x.spread: no [shards] configured"),
    ('dsn = "mysql://u@h/q"\n' + TWO, {}, None, "set dsn or [shards], not both"),
    ('[shards]\n"a b" = "mysql://u@h/q"\n', {}, None, "invalid shard name"),
    ('[shards]\na = 5\n', {}, None, "shards.a: expected a DSN string"),
    ('[shards]\na = "mysql://u@h:x/q"\n', {}, None, "shards.a: bad DSN"),
    ("", {"NOTIFYQ_SHARDS": "mysql://u@h/q"}, None, "NOTIFYQ_SHARDS: expected name="),
])
def test_bad_shard_config_is_one_clear_error(tmp_path, text, env, overrides, error):
    with pytest.raises(errors.ConfigError, match=error.replace("(", r"\(").replace("[", r"\[")):
        load(tmp_path, text, env, overrides)


def test_a_higher_level_dsn_replaces_the_files_shards(tmp_path):
    # Given [shards] in the file, a --dsn flag or NOTIFYQ_DSN looks at one server ...
    for env, overrides in (({"NOTIFYQ_DSN": "mysql://u@one/q"}, None), ({}, {"dsn": "mysql://u@one/q"})):
        cfg = load(tmp_path, TWO + '[queue.x]\nshard = "b"\n', env, overrides)
        assert cfg.shards == {} and cfg.dsn.host == "one"
    # ... and NOTIFYQ_SHARDS replaces a file's dsn
    cfg = load(tmp_path, 'dsn = "mysql://u@one/q"\n', {"NOTIFYQ_SHARDS": "z=mysql://u@two/q"})
    assert cfg.shard_names() == ("z",) and cfg.dsn.host == "two"


def test_placement_map_else_hash_independent_of_listing_order(tmp_path):
    cfg = load(tmp_path, TWO + '[shards.c]\ndsn = "mysql://u@h3/q"\n[queue.pinned]\nshard = "c"\n')
    reordered = load(tmp_path, '[shards]\nc = "mysql://u@h3/q"\nb = "mysql://u@h2:3308/q"\n'
                               'a = "mysql://u:Pa55w0rd@h1:3307/q"\n[queue.pinned]\nshard = "c"\n')
    place, place2 = placement.Placement(cfg), placement.Placement(reordered)
    assert place.home("pinned") == "c" and place.shards_of("pinned") == ("c",)
    names = [f"queue{i}" for i in range(300)]
    homes = {q: place.home(q) for q in names}
    assert homes == {q: place2.home(q) for q in names}
    assert set(collections.Counter(homes.values())) == {"a", "b", "c"}  # all shards get queues
    assert min(collections.Counter(homes.values()).values()) > 50  # roughly even


def test_adding_a_shard_moves_only_queues_to_the_new_shard(tmp_path):
    before = placement.Placement(load(tmp_path, TWO))
    after = placement.Placement(load(tmp_path, TWO + 'c = "mysql://u@h3/q"\n'))
    names = [f"queue{i}" for i in range(600)]
    moved = [q for q in names if before.home(q) != after.home(q)]
    assert all(after.home(q) == "c" for q in moved)
    assert 100 < len(moved) < 300  # about a third


def test_spread_round_robin_per_producer_and_dedup_key_by_hash(tmp_path):
    cfg = load(tmp_path, TWO + '[queue.s]\nspread = true\n')
    place = placement.Placement(cfg)
    assert place.spread("s") and place.shards_of("s") == ("a", "b") and not place.spread("other")
    turn = placement.RoundRobin(place.names, start=1)
    assert turn.take(3) + turn.take(2) == ["b", "a", "b", "a", "b"]
    keys = {k: place.for_key("s", k) for k in (f"k{i}" for i in range(100))}
    assert keys == {k: placement.Placement(cfg).for_key("s", k) for k in keys}  # stable
    assert set(keys.values()) == {"a", "b"}
    assert place.for_key("other", "k1") == place.home("other")  # a queue on one shard keeps it


def test_one_server_has_one_unnamed_shard(tmp_path):
    place = placement.Placement(load(tmp_path))
    assert place.names == ("",) and place.home("x") == "" and place.shards_of("x") == ("",)


def test_a_command_handler_never_inherits_a_shard_password():
    from notifyq.consume.commands import child_env

    secret = {"NOTIFYQ_SHARDS": "a=mysql://u@h1:1,h2:2/q,b=mysql://u:s3cret@h3/q"}
    assert child_env(secret) == {}
    plain = {"NOTIFYQ_SHARDS": "a=mysql://u@h1:1,h2:2/q,b=mysql://h3:5/q"}
    assert child_env(plain) == plain


@pytest.mark.parametrize("text, names", [("", [""]), (TWO, ["a", "b"])], ids=["one server", "two shards"])
def test_consumer_service_is_one_class_that_composes_one_server_services(tmp_path, text, names):
    import notifyq
    from notifyq.consume import service as one_server

    # Given a config of one server, or of two shards
    cfg = load(tmp_path, text + '[queue.s]\nspread = true\n' if text else text)
    # When notifyq.ConsumerService is made (nothing connects before run)
    service = notifyq.ConsumerService(cfg, notifyq.ConsumeOptions(queues=("s",), function=print))
    # Then it is an instance of the class called, never another class in its place, and it
    # composes one one-server service per server, named by its shard ("" alone)
    assert type(service) is notifyq.ConsumerService
    assert list(service.services) == names
    assert all(type(s) is one_server.ConsumerService and s.name == n for n, s in service.services.items())


@pytest.mark.parametrize("text, queue, pinned", [("", "s", ""), (TWO, "p", "b"), (TWO, "s", None)],
                         ids=["one server", "a pinned queue", "a spread queue"])
def test_producer_is_one_class_that_composes_one_server_producers(tmp_path, text, queue, pinned):
    import notifyq
    from notifyq.produce import producer as one_server

    # Given a config of one server, or of two shards with a queue pinned to b and one spread
    cfg = load(tmp_path, text + '[queue.s]\nspread = true\n[queue.p]\nshard = "b"\n' if text else text)
    # When notifyq.Producer is made (nothing connects before the first put)
    producer = notifyq.Producer(queue, cfg)
    # Then it is an instance of the class called, never another class in its place; a queue on
    # one server has that server's one-server producer, a spread queue makes its shards' on use
    assert type(producer) is notifyq.Producer and isinstance(producer, notifyq.Producer)
    if pinned is None:
        assert producer._pinned is None and producer.wake() is None  # nothing to wake: no conn= puts
        with pytest.raises(errors.InputError, match="give shard="):
            producer.result_dsn()
        assert producer.result_dsn("b") == cfg.shards["b"]
    else:
        assert type(producer._pinned) is one_server.Producer
        assert producer._pinned.config.dsn == producer.result_dsn() == (cfg.shards[pinned] if pinned else cfg.dsn)
    producer.close()
