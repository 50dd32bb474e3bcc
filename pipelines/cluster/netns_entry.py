"""How a command joins the run's network namespace (``pipelines.cluster.netns.enter``): by proof,
never by the holder's pid alone.

The command's first process is a shell (``ENTER``) that opens the holder's namespaces, proves them the
run's (after the open the holder's pid still has its recorded start, and the network namespace is the
recorded one), then ``nsenter`` joins them through those descriptors: a pid that names another process
by then (as root, any process's) is never joined. The proof is made as each command starts, however
late after the lookup, through descriptors of the command's own: callers start it with inherited
descriptors closed, and a parent's /proc/<pid>/fd is closed to its children when it is not dumpable.
A shell: any user can run it, unlike an interpreter under a folder only its owner can search.
"""

from __future__ import annotations

ENTER = r"""
pid=$1 start=$2 netns=$3 kinds=$4; shift 5
gone() { echo "the run's network namespace $netns is gone: pid $pid is not its holder any more" >&2; exit 1; }
field20() { shift 19; echo "$1"; }
{ command exec 3<"/proc/$pid/ns/net"; } 2>/dev/null || gone
if [ "$kinds" = net+user ]; then { command exec 4<"/proc/$pid/ns/user"; } 2>/dev/null || gone; fi
{ read -r stat <"/proc/$pid/stat"; } 2>/dev/null || gone
rest=${stat##*")"}  # after the command name: its start is the 20th field from here
[ "$(field20 $rest)" = "$start" ] && [ "$(readlink /proc/self/fd/3)" = "$netns" ] || gone
if [ "$kinds" = net+user ]; then exec nsenter --net=/proc/self/fd/3 --user=/proc/self/fd/4 --preserve-credentials -- "$@"; fi
exec nsenter --net=/proc/self/fd/3 -- "$@"
"""


def prefix(pid: int, start: int, netns: str, user: bool) -> tuple[str, ...]:
    """The command prefix that enters ``netns`` ("net:[inode]") held by ``pid``, which started at
    ``start`` (clock ticks after boot), with its user namespace when ``user`` (not root)."""
    return ("/bin/sh", "-c", ENTER, "enter", str(pid), str(start), netns, "net+user" if user else "net", "--")
