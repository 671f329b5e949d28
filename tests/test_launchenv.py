"""Where a rank's identity comes from (diag.launchenv): Slurm's syntaxes, precedence, mismatches, the port.

The environments are the variables srun and torchrun set (copied from a real srun of tests/test_slurm.py's
cluster); tests/test_slurm.py runs the same code under a real Slurm.
"""

from __future__ import annotations

import contextlib
import socket

import pytest

from diag import launchenv
from diag.errors import DiagError
from diag.launchenv import derived_port, detect, expand_counts, expand_hostlist


def srun_env(rank: int = 0, tasks_per_node: str = "1(x4)", nodelist: str = "h[0-3]", node: int | None = None,
             local: int = 0, **extra: str) -> dict[str, str]:
    """What srun -N 4 --ntasks-per-node 1 gives task ``rank`` (Slurm 22.05), without the rendezvous lookup's
    inputs (no slurm.conf: the first node is resolved by name)."""
    counts = expand_counts(tasks_per_node)
    nodes = expand_hostlist(nodelist)
    if node is None:
        node = next(i for i, upto in enumerate(_cumulative(counts)) if rank < upto)
    env = {"SLURM_JOB_ID": "1234", "SLURM_JOBID": "1234", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
           "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
           "SLURM_NTASKS": str(sum(counts)), "SLURM_STEP_NUM_TASKS": str(sum(counts)),
           "SLURM_NNODES": str(len(nodes)), "SLURM_STEP_NUM_NODES": str(len(nodes)),
           "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist, "SLURM_STEP_NODELIST": nodelist,
           "SLURM_STEP_TASKS_PER_NODE": tasks_per_node, "SLURM_TASKS_PER_NODE": tasks_per_node,
           "SLURMD_NODENAME": nodes[node], "SLURM_JOB_NUM_NODES": str(len(nodes))}
    env.update(extra)
    return env


def _cumulative(counts: list[int]) -> list[int]:
    total, out = 0, []
    for count in counts:
        total += count
        out.append(total)
    return out


# --- Slurm's syntaxes -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "names"), [
    ("h[0-3]", ["h0", "h1", "h2", "h3"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("gpu1,cpu[1-2],login", ["gpu1", "cpu1", "cpu2", "login"]),
    ("x[9-11]y", ["x9y", "x10y", "x11y"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a-b[1,3],c.d", ["a-b1", "a-b3", "c.d"]),
    ("node7", ["node7"]),
    ("a,,b", ["a", "b"]),
    ("n[8-010]", ["n8", "n9", "n10"]),
    ("node[1-2]x[3-4]", ["node1x3", "node1x4", "node2x3", "node2x4"]),
])
def test_hostlists_expand_as_scontrol_show_hostnames(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[1-", "n]", "n[a]", "n[3-1]", "", ",", "n[[1]]"])
def test_a_hostlist_that_is_not_slurms_is_one_line(text):
    with pytest.raises(DiagError) as error:
        expand_hostlist(text)
    assert "Slurm's node list" in str(error.value) and "\n" not in str(error.value)


def test_tasks_per_node():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("1") == [1]
    with pytest.raises(DiagError, match="tasks per node"):
        expand_counts("2x3")


def test_the_port_is_the_same_for_every_rank_and_differs_per_step():
    assert derived_port("1234", "0") == 22340 and derived_port("1234", "1") == 22341
    assert derived_port("5", "12") == 20052
    assert derived_port("4321_7", "0") == derived_port("4321_7", "0")   # array job ids are not numbers
    assert all(20000 <= derived_port(str(job), str(step)) < 30000 for job in range(0, 5000, 7) for step in range(12))


# --- what comes from where --------------------------------------------------------------------------------

def test_srun_alone_gives_every_part_from_slurms_variables():
    launch = detect(srun_env(rank=2), resolve=False)
    assert launch is not None and launch.launcher == "slurm"
    assert (launch.rank, launch.world_size, launch.local_rank, launch.local_world_size, launch.node_rank) == (
        2, 4, 0, 1, 2)
    assert launch.master_addr == "h0" and launch.master_port == 22340
    assert launch.slurm is not None and launch.slurm.nodes == ("h0", "h1", "h2", "h3")
    assert launch.slurm.node_name == "h2"
    assert launch.sources["rank"] == "SLURM_PROCID" and launch.sources["world_size"] == "SLURM_STEP_NUM_TASKS"
    assert launch.sources["node_rank"] == "SLURM_NODEID" and "SLURM_STEP_NODELIST" in launch.sources["node_name"]
    assert "derived from SLURM_JOB_ID 1234 and SLURM_STEP_ID 0" in launch.sources["master_port"]
    assert not launch.notes
    # the JSON run.json keeps reads back as the same launch
    assert launchenv.LaunchEnv.from_json(launch.to_json()) == launch


def test_the_job_node_list_stands_in_for_the_steps():
    env = srun_env(rank=1)
    del env["SLURM_STEP_NODELIST"]
    launch = detect(env, resolve=False)
    assert launch is not None and launch.slurm.nodes == ("h0", "h1", "h2", "h3")
    assert "SLURM_JOB_NODELIST" in launch.sources["node_name"]


def test_a_rendezvous_exported_before_srun_wins():
    launch = detect(srun_env(MASTER_ADDR="10.1.2.3", MASTER_PORT="29999"), resolve=False)
    assert (launch.master_addr, launch.master_port) == ("10.1.2.3", 29999)
    assert launch.sources["master_addr"].startswith("MASTER_ADDR") and launch.sources["master_port"].startswith(
        "MASTER_PORT")


def test_under_srun_torchrun_torchruns_variables_win():
    env = {**srun_env(rank=3), "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "4", "MASTER_ADDR": "h2", "MASTER_PORT": "29500",
           "TORCHELASTIC_RUN_ID": "42"}
    launch = detect(env, resolve=False)
    assert launch is not None and launch.launcher == "torchrun"
    assert (launch.rank, launch.world_size, launch.node_rank) == (1, 4, 1)
    assert (launch.master_addr, launch.master_port) == ("h2", 29500)
    assert launch.sources["rank"] == "RANK" and launch.slurm is not None and launch.slurm.job_id == "1234"
    assert "torchrun started by srun" in launch.describe()


def test_other_env_launchers_and_no_launcher():
    launch = detect({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, resolve=False)
    assert launch is not None and launch.launcher == "env" and launch.slurm is None
    assert detect({}, resolve=False) is None
    # a step of one task (srun --pty bash, srun -n 1) is a shell, not a job of ranks
    assert detect(srun_env(tasks_per_node="1", nodelist="h0"), resolve=False) is None
    # a batch script: SLURM_PROCID=0 and SLURM_NTASKS, but no step
    batch = {k: v for k, v in srun_env().items() if not k.startswith("SLURM_STEP")}
    assert detect(batch, resolve=False) is None


def test_a_batch_script_of_several_nodes_is_refused_in_one_line():
    batch = {k: v for k, v in srun_env().items() if not k.startswith("SLURM_STEP")}
    with pytest.raises(DiagError, match="outside srun: start it with srun --ntasks-per-node 1 diag reproduce"):
        launchenv.refuse_batch_script("diag reproduce", batch)
    launchenv.refuse_batch_script("diag reproduce", {**batch, "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1"})
    launchenv.refuse_batch_script("diag reproduce", srun_env())   # inside a step: srun's, not a batch script
    launchenv.refuse_batch_script("diag reproduce", {})


def test_several_tasks_per_node_run_and_say_what_they_mean():
    launch = detect(srun_env(rank=3, tasks_per_node="2(x2)", nodelist="n[1-2]", local=1), resolve=False)
    assert (launch.rank, launch.world_size, launch.local_rank, launch.local_world_size, launch.node_rank) == (
        3, 4, 1, 2, 1)
    assert len(launch.notes) == 1 and "2 per node on 2 node(s)" in launch.notes[0]
    assert "--ntasks-per-node 1" in launch.notes[0]


# --- mismatches: one line each ----------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "words"), [
    ({"SLURM_NTASKS": "8"}, "SLURM_NTASKS=8 but SLURM_STEP_NUM_TASKS=4"),
    ({"SLURM_STEP_NUM_NODES": "3"}, "holds 4 node(s) but SLURM_STEP_NUM_NODES=3"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x4)"}, "tasks per node 2,2,2,2"),
    ({"SLURMD_NODENAME": "h3"}, "SLURMD_NODENAME=h3 but SLURM_NODEID=1 is h1"),
    ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4 is outside the step's 4 tasks"),
    ({"SLURM_NODEID": "7"}, "SLURM_NODEID=7 is outside"),
    ({"SLURM_LOCALID": "1"}, "SLURM_LOCALID=1 is outside the 1 task(s) of node h1"),
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not a whole number"),
])
def test_slurm_variables_that_disagree_are_one_line(change, words):
    env = {**srun_env(rank=1), **change}
    with pytest.raises(DiagError) as error:
        detect(env, resolve=False)
    message = str(error.value)
    assert words in message and "\n" not in message


def test_task_zero_off_the_first_node_asks_for_master_addr():
    env = srun_env(rank=0, node=1, SLURMD_NODENAME="h1")
    with pytest.raises(DiagError, match=r"task 0 runs on h1, not on the step's first node h0.*MASTER_ADDR"):
        detect(env, resolve=False)


def test_srun_starting_more_torchruns_than_torchruns_nodes_is_one_line():
    """srun --nodes 2 --ntasks-per-node 2 torchrun --nnodes 2: four torchruns for a job of two nodes."""
    env = {**srun_env(rank=1, tasks_per_node="2(x2)", nodelist="h[0-1]", local=1), "RANK": "1", "WORLD_SIZE": "2",
           "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "7", "MASTER_ADDR": "h0", "MASTER_PORT": "29500"}
    with pytest.raises(DiagError) as error:
        detect(env, resolve=False)
    assert str(error.value) == ("srun started 4 torchruns (2 per node on 2 node(s)) but torchrun's job has 2 nodes "
                                "(--nnodes 2): start one torchrun per node, srun --nodes 2 --ntasks-per-node 1 "
                                "torchrun --nnodes ...")


# --- adopt: the env:// variables, the rendezvous, the port check ----------------------------------------------

def test_adopt_exports_env_variables_once_and_current_reads_them_back():
    env = srun_env(rank=1, nodelist="localhost,h1,h2,h3", MASTER_PORT="29501")
    launch = launchenv.adopt(iface="lo", environ=env)
    assert launch is not None and launch.master_addr == "127.0.0.1"
    assert launch.sources["master_addr"] == "the step's first node localhost, resolved to 127.0.0.1"
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                "MASTER_ADDR", "MASTER_PORT", "DIAG_NODE_NAME")} == {
        "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29501", "DIAG_NODE_NAME": "h1"}
    again = detect(env)   # RANK is set now, but the decision is Slurm's, not a torchrun's
    assert again == launch and launchenv.adopt(iface="lo", environ=env) == launch
    # a child given a rank of its own by another launcher is not this rank
    assert detect({**env, "RANK": "0"}, resolve=False).launcher == "env"


def test_a_first_node_that_resolves_to_loopback_needs_iface():
    env = srun_env(rank=1, nodelist="localhost,h1,h2,h3", MASTER_PORT="29501")
    with pytest.raises(DiagError, match=r"resolves to 127\.0\.0\.1 \(loopback\).*--iface"):
        launchenv.adopt(environ=env)
    assert "RANK" not in env


def test_an_unresolvable_first_node_is_one_line():
    env = srun_env(rank=1, nodelist="nosuchnode-diag.invalid,h1,h2,h3")
    with pytest.raises(DiagError, match=r"cannot resolve the step's first node 'nosuchnode-diag\.invalid'"):
        launchenv.adopt(iface="lo", environ=env)


def test_rank_zero_refuses_a_derived_port_in_use():
    with _listener_in_derived_range() as port:
        job, step = (port - launchenv.PORT_BASE) // 10, port % 10
        env = srun_env(rank=0, nodelist="localhost,h1,h2,h3", SLURM_JOB_ID=str(job), SLURM_STEP_ID=str(step))
        with pytest.raises(DiagError) as error:
            launchenv.adopt(iface="lo", environ=env)
    assert f"the rendezvous port {port} (derived from SLURM_JOB_ID {job}" in str(error.value)
    assert "export MASTER_PORT" in str(error.value)
    # the port free again: rank 0 takes it
    launch = launchenv.adopt(iface="lo", environ=env)
    assert launch is not None and launch.master_port == port and env["MASTER_PORT"] == str(port)


@contextlib.contextmanager
def _listener_in_derived_range():
    for port in range(launchenv.PORT_BASE + 9000, launchenv.PORT_BASE + 9990):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            sock.close()
            continue
        sock.listen(1)
        try:
            yield port
        finally:
            sock.close()
        return
    pytest.skip("no free port in 29000-29990 to hold")


def test_diags_own_launches_drop_the_rank_variables():
    """A lab started from inside a Slurm step: its ranks must not read the step as theirs."""
    assert {"RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS",
            launchenv.LAUNCH_ENV} <= launchenv.OWN_RANK_VARIABLES
    env = {k: v for k, v in srun_env().items() if k not in launchenv.OWN_RANK_VARIABLES}
    assert detect(env, resolve=False) is None
