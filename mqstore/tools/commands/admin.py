"""``mqstore admin``: what an operator asks a running broker first, over the remoting protocol
(RocketMQ's mqadmin for the same questions), as tables or ``--json``.

    mqstore admin status [--broker HOST:PORT] [--json]          the broker's runtime figures, replication
    mqstore admin topics [--broker HOST:PORT] [--json]          topics, queues, perm, messages
    mqstore admin topic-create NAME [--queues N] [--perm P] [--broker HOST:PORT]
    mqstore admin groups [--broker HOST:PORT] [--json]          consumer groups: online clients, lag
    mqstore admin group NAME [--broker HOST:PORT] [--json]      one group's lag per queue, its clients
    mqstore admin promote DIR [--config broker.conf] [--master MASTER_DIR [--allow-behind]] [--json]
                                                                make a stopped slave's store a master's

``--broker`` defaults to 127.0.0.1:10911. Exit codes: 0, 1 when the broker refused (its code and
remark are printed), 2 for usage errors or a broker that cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from mqstore.broker.codes import RequestCode
from mqstore.tools.commands.common import print_json, print_lines, table

DEFAULT_BROKER = "127.0.0.1:10911"
TIMEOUT_S = 10.0

R = RequestCode


class AdminError(Exception):
    """The broker answered a request with an error code."""

    def __init__(self, code: int, remark: str | None, what: str) -> None:
        super().__init__(f"{what}: the broker answered code {code}: {remark}")
        self.code = code


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="admin_command", metavar="WHAT", required=True)
    for name, help_text in (("status", "the broker's runtime figures"),
                            ("topics", "topics with their queues, permission and message counts"),
                            ("groups", "consumer groups: online clients, total lag")):
        s = sub.add_parser(name, help=help_text)
        _common(s)
    s = sub.add_parser("topic-create", help="create (or update) a topic on the broker")
    s.add_argument("name", metavar="NAME")
    s.add_argument("--queues", type=int, default=8, help="read and write queues (default 8)")
    s.add_argument("--perm", type=int, default=6, help="permission bits: 4 read, 2 write (default 6)")
    _common(s)
    s = sub.add_parser("group", help="one consumer group: lag per queue and its clients")
    s.add_argument("name", metavar="NAME")
    _common(s)
    s = sub.add_parser("promote", help="make a stopped slave's store directory a master's (after checking it)")
    s.add_argument("store", metavar="DIR")
    s.add_argument("--config", metavar="FILE",
                   help="the slave's broker.conf: its brokerRole becomes ASYNC_MASTER and brokerId 0")
    s.add_argument("--master", metavar="MASTER_DIR",
                   help="the old master's store directory, if its disk can still be read: each CommitLog of the "
                        "slave must end where the master's does (or later)")
    s.add_argument("--allow-behind", action="store_true",
                   help="with --master: promote a slave whose CommitLog is behind the master's, saying which")
    s.add_argument("--json", action="store_true", help="print JSON")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", default=DEFAULT_BROKER, metavar="HOST:PORT",
                   help=f"the broker to ask (default {DEFAULT_BROKER})")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--access-key", metavar="AK", default=os.environ.get("MQSTORE_ACCESS_KEY", ""),
                   help="sign every request with this account of the broker's ACL (an admin one); its secret "
                        "comes from the environment variable MQSTORE_SECRET_KEY, never from the command line")


def _credentials(args: argparse.Namespace) -> tuple[str, str] | None:
    if not args.access_key:
        return None
    return (args.access_key, os.environ.get("MQSTORE_SECRET_KEY", ""))


def run(args: argparse.Namespace) -> int:
    from mqstore.client import ClientError

    if args.admin_command == "promote":
        return promote(args.store, args.config, as_json=args.json, master=args.master, allow_behind=args.allow_behind)
    if args.access_key and not os.environ.get("MQSTORE_SECRET_KEY"):
        print("mqstore admin: --access-key needs its secret in the environment variable MQSTORE_SECRET_KEY",
              file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args))
    except AdminError as exc:
        print(f"mqstore admin: {exc}", file=sys.stderr)
        return 1
    except (ClientError, OSError) as exc:
        print(f"mqstore admin: cannot ask {args.broker}: {exc}", file=sys.stderr)
        return 2


class _Broker:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def call(self, code: int, what: str, fields: dict[str, str] | None = None) -> Any:
        from mqstore.remoting._remoting import RemotingCommand

        answer = await self.conn.request(RemotingCommand(code, ext_fields=fields or {}), TIMEOUT_S)
        if answer.code != 0:
            raise AdminError(answer.code, answer.remark, what)
        return answer

    async def json(self, code: int, what: str, fields: dict[str, str] | None = None) -> Any:
        answer = await self.call(code, what, fields)
        return json.loads(answer.body) if answer.body else {}

    async def offset(self, code: int, topic: str, queue_id: int) -> int:
        answer = await self.call(code, f"offset of {topic}:{queue_id}", {"topic": topic, "queueId": str(queue_id)})
        return int(answer.ext_fields.get("offset", "0"))


async def _run(args: argparse.Namespace) -> int:
    from mqstore.acl.signature import as_credentials
    from mqstore.client import RemotingConnection

    conn = await RemotingConnection.open(args.broker, credentials=as_credentials(_credentials(args)))
    try:
        broker = _Broker(conn)
        command = args.admin_command
        if command == "status":
            return _show(args, await status(broker))
        if command == "topics":
            return _show(args, await topics(broker))
        if command == "topic-create":
            await broker.call(R.UPDATE_AND_CREATE_TOPIC, f"create topic {args.name}", {
                "topic": args.name, "defaultTopic": "TBW102", "readQueueNums": str(args.queues),
                "writeQueueNums": str(args.queues), "perm": str(args.perm), "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": "0", "order": "false"})
            out = {"topic": args.name, "queues": args.queues, "perm": args.perm, "created": True}
            return _show(args, out) if args.json else _say(f"topic {args.name}: {args.queues} queues, perm {args.perm}")
        if command == "groups":
            return _show(args, await groups(broker))
        return _show(args, await group(broker, args.name))
    finally:
        conn.close()


def _say(line: str) -> int:
    print(line)
    return 0


async def status(broker: _Broker) -> dict[str, Any]:
    info = await broker.json(R.GET_BROKER_RUNTIME_INFO, "broker runtime info")
    table = info.get("table", {})
    return {"kind": "status", "table": table, "replication": replication_of(table)}


def _number(text: str | None) -> int | float:
    try:
        return int(text or 0)
    except ValueError:
        try:
            return float(text or 0)
        except ValueError:
            return 0


def replication_of(table: dict[str, str], now_ms: int | None = None) -> dict[str, Any]:
    """The replication keys of a runtime info table (BrokerController._ha_runtime_info) in the
    shape of mqstore.tools.stats.replication_figures, so that the same lines word them; role
    None when the table has none (a broker that does not say)."""
    from mqstore.broker.controller import HA_SLAVE_KEYS, log_key
    from mqstore.tools.stats import log_replication

    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    count = int(_number(table.get("commitLogCount"))) if "commitLogCount" in table else 1
    out: dict[str, Any] = {"role": None, "ha_port": 0, "ha_slaves": 0, "ha_report_ms": 0, "last_report_ago_ms": None,
                           "confirmed": _number(table.get("confirmed")), "fall_behind_bytes": None, "service": None,
                           "service_age_ms": None}
    if "haMasterAddress" in table:
        out.update(role="slave", service={
            "role": "slave", "master": table["haMasterAddress"] or None, "master_broker": table.get("masterAddr") or None,
            "connected": table.get("haConnected") == "true", "offset": _number(table.get("haReportedOffset")),
            "last_error": table.get("haLastError") or None, "diverged": table.get("haDiverged") or None})
        if count > 1:  # a client per log (BrokerController._ha_runtime_info's _L<k> keys)
            out["service"]["logs"] = [{
                "master": table["haMasterAddress"] or None, "connected": table.get(log_key("haConnected", k)) == "true",
                "offset": _number(table.get(log_key("haReportedOffset", k))),
                "last_error": table.get(log_key("haLastError", k)) or None,
                "diverged": table.get(log_key("haDiverged", k)) or None} for k in range(count)]
    elif "haServerAddr" in table:
        slaves: dict[tuple[int, str], dict[str, Any]] = {}
        for key, value in table.items():
            for prefix, name in HA_SLAVE_KEYS.items():
                if key.startswith(prefix):
                    address, k = key[len(prefix):], 0
                    if count > 1:  # every log's slaves under _L<k>; the keys without it repeat log 0's
                        address, sep, log = address.rpartition("_L")
                        if not sep or not log.isdigit():
                            continue
                        k = int(log)
                    entry = slaves.setdefault((k, address), {"slave": address, **({"log": k} if count > 1 else {})})
                    entry[name] = _number(value)
        report_ms = int(_number(table.get("haLastReportTimestamp")))
        out.update(role="master", ha_port=int(_number(table["haServerAddr"].rpartition(":")[2])),
                   ha_slaves=_number(table.get("haSlaveCount")), ha_report_ms=report_ms,
                   last_report_ago_ms=max(0, now_ms - report_ms) if report_ms > 0 else None,
                   fall_behind_bytes=_number(table.get("slaveFallBehindMuch")),
                   service={"role": "master", "slaves": [slaves[key] for key in sorted(slaves)]})
        if count > 1:
            out["logs"] = [log_replication(
                "master", now_ms, k, int(_number(table.get(log_key("commitLogMaxOffset", k)))),
                int(_number(table.get(log_key("confirmed", k)))), int(_number(table.get(log_key("haSlaveCount", k)))),
                int(_number(table.get(log_key("haLastReportTimestamp", k))))) for k in range(count)]
    return out


async def topics(broker: _Broker) -> dict[str, Any]:
    wrapper = await broker.json(R.GET_ALL_TOPIC_CONFIG, "topic list")
    rows = []
    for name, tc in sorted(wrapper.get("topicConfigTable", {}).items()):
        queues = int(tc.get("readQueueNums", 0))
        messages = 0
        for qid in range(min(queues, 1024)):
            messages += await broker.offset(R.GET_MAX_OFFSET, name, qid) - await broker.offset(R.GET_MIN_OFFSET, name, qid)
        rows.append({"topic": name, "read_queues": queues, "write_queues": int(tc.get("writeQueueNums", 0)),
                     "perm": int(tc.get("perm", 0)), "messages": messages})
    return {"kind": "topics", "topics": rows}


async def _offsets(broker: _Broker) -> dict[str, dict[int, int]]:
    table = (await broker.json(R.GET_ALL_CONSUMER_OFFSET, "consumer offsets")).get("offsetTable", {})
    return {key: {int(q): int(o) for q, o in queues.items()} for key, queues in table.items()}


async def _lag_rows(broker: _Broker, group_name: str, offsets: dict[str, dict[int, int]]) -> list[dict[str, Any]]:
    rows = []
    for key, queues in sorted(offsets.items()):
        topic, _, grp = key.rpartition("@")
        if grp != group_name:
            continue
        for qid, committed in sorted(queues.items()):
            max_offset = await broker.offset(R.GET_MAX_OFFSET, topic, qid)
            rows.append({"topic": topic, "queue": qid, "broker_offset": max_offset, "consumer_offset": committed,
                         "lag": max(0, max_offset - committed)})
    return rows


async def _clients(broker: _Broker, group_name: str) -> list[dict[str, Any]]:
    from mqstore.remoting._remoting import RemotingCommand

    answer = await broker.conn.request(RemotingCommand(R.GET_CONSUMER_CONNECTION_LIST,
                                                       ext_fields={"consumerGroup": group_name}), TIMEOUT_S)
    if answer.code != 0:  # CONSUMER_NOT_ONLINE: no client now
        return []
    return list(json.loads(answer.body).get("connectionSet", []))


async def groups(broker: _Broker) -> dict[str, Any]:
    configs = (await broker.json(R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, "consumer groups")).get("subscriptionGroupTable", {})
    offsets = await _offsets(broker)
    names = sorted(set(configs) | {key.rpartition("@")[2] for key in offsets})
    rows = []
    for name in names:
        lag = await _lag_rows(broker, name, offsets)
        clients = await _clients(broker, name)
        if not lag and not clients and name in configs and name.isupper():
            continue  # a startup system group nobody uses
        rows.append({"group": name, "clients": len(clients), "topics": sorted({r["topic"] for r in lag}),
                     "lag": sum(r["lag"] for r in lag)})
    return {"kind": "groups", "groups": rows}


async def group(broker: _Broker, name: str) -> dict[str, Any]:
    offsets = await _offsets(broker)
    return {"kind": "group", "group": name, "queues": await _lag_rows(broker, name, offsets),
            "clients": await _clients(broker, name)}


def _show(args: argparse.Namespace, out: dict[str, Any]) -> int:
    if args.json:
        print_json(out)
        return 0
    kind = out["kind"]
    if kind == "status":
        from mqstore.broker.controller import HA_SLAVE_KEYS
        from mqstore.tools.stats import replication_lines

        # the per-slave keys are worded below, one line per slave
        shown = {k: v for k, v in out["table"].items() if not k.startswith(tuple(HA_SLAVE_KEYS))}
        width = max((len(k) for k in shown), default=0)
        print_lines([f"{k:<{width}}  {v}" for k, v in sorted(shown.items())])
        replication = replication_lines(out["replication"])
        if replication:
            print_lines(["", *replication])
    elif kind == "topics":
        print_lines(table(["topic", "read", "write", "perm", "messages"],
                          [[r["topic"], r["read_queues"], r["write_queues"], r["perm"], r["messages"]]
                           for r in out["topics"]], what="topics", indent="", limit=10_000))
    elif kind == "groups":
        print_lines(table(["group", "clients", "lag", "topics"],
                          [[r["group"], r["clients"], r["lag"], ", ".join(r["topics"])] for r in out["groups"]],
                          what="groups", indent="", limit=10_000) or ["no consumer groups"])
    else:
        print(f"group {out['group']}: {len(out['clients'])} client(s) online, "
              f"lag {sum(r['lag'] for r in out['queues']):,}")
        print_lines(table(["topic", "queue", "broker offset", "consumer offset", "lag"],
                          [[r["topic"], r["queue"], r["broker_offset"], r["consumer_offset"], r["lag"]]
                           for r in out["queues"]], what="queues", indent="  ", limit=10_000))
        for c in out["clients"]:
            print(f"  client {c.get('clientId')} ({c.get('language')}, version {c.get('version')})")
    return 0


# -- promotion ---------------------------------------------------------------------------------
_ROLE_KEYS = {"brokerrole": ("brokerRole", "ASYNC_MASTER"), "broker_role": ("broker_role", "ASYNC_MASTER"),
              "brokerid": ("brokerId", "0"), "broker_id": ("broker_id", "0")}
_DROPPED_KEYS = ("hamasteraddress", "ha_master_address")


def promote(root: str, config_path: str | None, *, as_json: bool = False, master: str | None = None,
            allow_behind: bool = False) -> int:
    """Make a stopped slave's store a master's: the store must not be running (its lock is
    taken for the check), every invariant must hold (mqstore verify's check; a torn record at
    the end of a slave that crashed is allowed: the next open truncates it), then the HA address
    the slave had learned is forgotten and, with --config, the broker.conf says brokerRole
    ASYNC_MASTER and brokerId 0 (any haMasterAddress line goes). 0 when promoted, 1 when the
    check found problems (nothing is changed), 2 when the directory is not a store or is running.

    A store with several CommitLogs is checked log by log: each log's end and records are
    reported, and a log with a problem (or a torn tail longer than a record) refuses the
    promotion, named. ``master``: the old master's store directory, when its disk can still be
    read: its CommitLog count must be the slave's, and each log's end (as opening it would
    recover it, mqstore recover's plan) is compared with the slave's; a slave log behind its
    master's refuses the promotion, naming the log and the bytes missing (``allow_behind``:
    promote anyway, saying so)."""
    from mqstore.errors import MQStoreError
    from mqstore.ha import HA_MASTER_FILE
    from mqstore.log.directory import release_store_lock, require_store, take_store_lock
    from mqstore.queue.files import store_config
    from mqstore.tools.checker import check_store

    try:
        root = require_store(root)
        fd = take_store_lock(root)
    except MQStoreError as exc:
        print(f"mqstore admin promote: {exc} (stop the slave first)", file=sys.stderr)
        return 2
    try:
        config = store_config(root)
        count = config.commit_log_count
        report = check_store(root, allow_torn_tail=True, config=config)
        logs = _promote_logs(report, count, config.max_record_size)
        problems = [str(p) for p in report.problems if count == 1 or _problem_log(p, report, count) is None]
        if count == 1 and report.torn_tail_bytes > config.max_record_size:
            problems.append(_torn_problem(report.torn_tail_bytes, report.valid_end))
        behind: list[str] = []
        if master is not None and not any(e["problems"] for e in logs) and not problems:
            why = _compare_master(master, [e["end"] for e in logs] if logs else [report.valid_end], count)
            if isinstance(why, int):
                return why
            behind = why
        failed = [e for e in logs if e["problems"]]
        if problems or failed or (behind and not allow_behind):
            _refusal(root, logs, problems, behind, count)
            return 1
        try:
            os.unlink(os.path.join(root, HA_MASTER_FILE))
        except FileNotFoundError:
            pass
        changed = _promote_conf(config_path) if config_path else []
    finally:
        release_store_lock(fd)
    start = f"mqstore broker {root} --config {config_path}" if config_path else \
        f"mqstore broker {root} --set broker_role=ASYNC_MASTER --set broker_id=0"
    out = {"store": root, "log_end": report.valid_end, "records": report.records, "torn_tail_bytes":
           report.torn_tail_bytes, "config": config_path, "config_changes": changed, "start_with": start}
    if count > 1:
        out["logs"] = [{k: v for k, v in e.items() if k != "problems"} for e in logs]
    if behind:
        out["behind_master"] = behind
    if as_json:
        print_json(out)
    else:
        if count == 1:
            print(f"promoted {root}: its CommitLog ends at {report.valid_end:,} ({report.records:,} records checked"
                  + (f"; the {report.torn_tail_bytes} bytes of a torn record after it go at the next open"
                     if report.torn_tail_bytes else "") + ")")
        else:
            print(f"promoted {root}: its {count} CommitLogs checked, {report.records:,} records")
            print_lines([f"  {_log_line(e)}" for e in logs])
        for line in behind:
            print(f"  WARNING: {line} (--allow-behind)")
        for line in changed:
            print(f"  {config_path}: {line}")
        print(f"start it as the master: {start}")
    return 0


def _torn_problem(torn: int, end: int) -> str:
    # more than one record the slave was receiving when it crashed: bytes in the middle of its
    # log are damaged, and the next open would drop everything after them
    return f"{torn:,} bytes after the last valid record at {end:,} do not parse: more than a record cut by a crash"


def _problem_log(problem: Any, report: Any, count: int) -> int | None:
    """The CommitLog a problem of a several-log store's check is about: found in its files or
    cells (the checker's ``log_problems``), a ConsumeQueue of a queue bound to it, an entry
    of its ``index-k/``; None for the store's other parts."""
    from mqstore.twin.logs import log_of_queue

    for k, found in report.log_problems.items():
        if any(p is problem for p in found):
            return int(k)
    where = str(problem.where)
    if where.startswith("consumequeue/"):
        topic, _, qid = where[len("consumequeue/"):].rpartition("/")
        if topic and qid.isdigit():
            return int(log_of_queue(topic, int(qid), count))
    head, sep, _ = where.partition("/")
    if sep and head == "index":
        return 0
    if sep and head.startswith("index-") and head[len("index-"):].isdigit():
        return int(head[len("index-"):])
    return None


def _promote_logs(report: Any, count: int, max_record: int) -> list[dict[str, Any]]:
    """Each CommitLog of a several-log store as promote reports it: its end, records, torn
    tail and problems (in words); [] for a store with one."""
    if count == 1:
        return []
    logs = []
    for k in range(count):
        if k not in report.log_ends:
            logs.append({"log": k, "end": None, "records": None, "torn_tail_bytes": None,
                         "problems": ["not checked: the check stopped at an earlier CommitLog"]})
            continue
        torn = report.log_torn_tail_bytes.get(k, 0)
        found = [str(p) for p in report.problems if _problem_log(p, report, count) == k]
        if torn > max_record:
            found.append(_torn_problem(torn, report.log_ends[k]))
        logs.append({"log": k, "end": report.log_ends[k], "records": report.log_records.get(k, 0),
                     "torn_tail_bytes": torn, "problems": found})
    return logs


def _log_line(e: dict[str, Any]) -> str:
    if e["end"] is None:
        return f"CommitLog {e['log']}: not checked"
    torn = (f"; the {e['torn_tail_bytes']} bytes of a torn record after it go at the next open"
            if e["torn_tail_bytes"] else "")
    return f"CommitLog {e['log']}: ends at {e['end']:,} ({e['records']:,} records checked{torn})"


def _refusal(root: str, logs: list[dict[str, Any]], problems: list[str], behind: list[str], count: int) -> None:
    failed = [e for e in logs if e["problems"]]
    total = len(problems) + sum(len(e["problems"]) for e in failed)
    if count == 1 or not failed:
        head = f"{total} problem(s)" if total else "behind its master"
    else:
        head = (", ".join(f"CommitLog {e['log']}" for e in failed) + f" failed the check: {total} problem(s)")
    print(f"mqstore admin promote: {root} is not promoted: {head}:", file=sys.stderr)
    for e in logs:
        print(f"  {_log_line(e)}" + (f": {len(e['problems'])} problem(s)" if e["problems"] else ", no problem"),
              file=sys.stderr)
        for problem in e["problems"][:20]:
            print(f"    {problem}", file=sys.stderr)
        if len(e["problems"]) > 20:
            print(f"    ... and {len(e['problems']) - 20} more", file=sys.stderr)
    for problem in problems[:20]:
        print(f"  {problem}", file=sys.stderr)
    for line in behind:
        print(f"  {line} (--allow-behind promotes it anyway)", file=sys.stderr)


def _compare_master(master: str, mine: list[int], count: int) -> list[str] | int:
    """The slave's log ends (``mine``, by log) against the old master's store: [] when none is behind, else a line per
    log behind (naming it, the bytes missing); 1 when the log counts differ and 2 when the
    master's directory cannot be read (both said on stderr)."""
    from mqstore.errors import MQStoreError
    from mqstore.log.directory import require_store
    from mqstore.queue.files import store_config
    from mqstore.tools.inspection import plan_recovery

    try:
        master = require_store(master)
        theirs = store_config(master).commit_log_count
        if theirs != count:
            print(f"mqstore admin promote: the master's store {master} has {theirs} CommitLog(s), this slave "
                  f"{count}: " + (f"CommitLog(s) {count} .. {theirs - 1} were never replicated" if theirs > count
                                   else "it was not this store's master") + "; not promoted", file=sys.stderr)
            return 1
        plan = plan_recovery(master)
    except (MQStoreError, OSError) as exc:
        print(f"mqstore admin promote: cannot read the master's store {master}: {exc}", file=sys.stderr)
        return 2
    ends = [p.report.valid_end for p in (plan.logs or [plan])]
    out = []
    for k, (end, their_end) in enumerate(zip(mine, ends)):
        if end < their_end:
            which = f"CommitLog {k}" if count > 1 else "its CommitLog"
            out.append(f"{which} is {their_end - end:,} bytes behind the master's: it ends at {end:,}, "
                       f"the master's at {their_end:,}")
    return out


def _promote_conf(path: str) -> list[str]:
    """Rewrite a broker.conf's role lines for a master; what changed, in words."""
    from mqstore.log.directory import replace_file

    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    out, changed, seen = [], [], set()
    for line in lines:
        key, sep, value = line.partition("=")
        k = key.strip().lower()
        if sep and not line.lstrip().startswith("#") and k in _ROLE_KEYS:
            name, want = _ROLE_KEYS[k]
            seen.add(name.lower().replace("_", ""))
            if value.strip() != want:
                changed.append(f"{key.strip()}={value.strip()} -> {want}")
            out.append(f"{key.strip()}={want}")
        elif sep and not line.lstrip().startswith("#") and k in _DROPPED_KEYS:
            changed.append(f"{key.strip()}={value.strip()} dropped")
        else:
            out.append(line)
    for name, want in (("brokerRole", "ASYNC_MASTER"), ("brokerId", "0")):
        if name.lower() not in seen:
            out.append(f"{name}={want}")
            changed.append(f"{name}={want} added")
    replace_file(path, "\n".join(out) + "\n")
    return changed
