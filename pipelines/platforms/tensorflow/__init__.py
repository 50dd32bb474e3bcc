"""TensorFlow: Keras 3 on TensorFlow with ``tf.distribute.MultiWorkerMirroredStrategy``, the fourth
framework the seed article names, beside PyTorch's platforms.

``worker.py`` is the training process: a second implementation of the benchmark's model shape
(Keras Hub's BERT backbone + BertForSequenceClassification's head, random weights) on the same token
shards, batch, learning rate, schedule and epochs, timed by the same ``TrainingRecord``;
``adapter.py`` starts ``launcher.py`` on one host (``--nproc``, loopback ports) or one per host with
every rank's address, which starts the host's ranks (each told the cluster by ``TF_CONFIG``). Its accuracy is compared with the torch platforms', its
time is not the same code's: the report says so (``study_note``, ``mode_caveats``).

Its libraries (``requirements-tensorflow.txt``) co-install with the pinned set and are installed
into ``.venv`` by ``scripts/bootstrap.sh``; the compose image leaves them out (2.1 GB installed), so the stack
does not offer the platform (its preflight says why). Not in the default matrix or the smoke run:
a run names it (``backends=[..., "tensorflow"]``).
"""

from pipelines.platforms import Platform, register

MODE = "multi-worker-mirrored"
SECOND_IMPLEMENTATION = ("a second implementation of the same shape (Keras Hub's BERT backbone, 2 layers, hidden "
                         "128, 2 heads, BertForSequenceClassification's head, random weights) on the same tokens, "
                         "batch, learning rate, schedule and epochs: its accuracy compares the recipe, its time "
                         "compares TensorFlow's graph and ring all-reduce with torch's, not one code under two launchers")

PLATFORM = register(Platform(
    name="tensorflow", adapter=f"{__name__}.adapter:TensorFlowBackend", order=50,
    label="TensorFlow (Keras, MultiWorkerMirroredStrategy)", colour="#ea580c",
    mode_caveats={MODE: SECOND_IMPLEMENTATION, **{f"{MODE}-{h}-hosts": SECOND_IMPLEMENTATION for h in range(2, 9)}},
    study_note="not in the study; " + SECOND_IMPLEMENTATION,
    smoke=False, default=False,  # its libraries are an extra (requirements-tensorflow.txt): a run names it
    distributions=("tensorflow", "keras-hub"),
    cluster_files=("TF_CONFIG per worker: every worker's host:port and its own index (written by the adapter "
                   "from cluster.hosts here)",),
    features={"fault tolerance": (
        "a failed attempt (a lost host's too: tests/platforms/test_host_loss.py) resumes from its "
        "tf.train.Checkpoint of the last epoch (the project's retry relaunches it)",
        "tests/platforms/tensorflow/test_tensorflow.py::test_a_failed_attempt_resumes_from_its_checkpoint")},
    # the ranks mark themselves (pid files); the per-host process that starts them is the platform's
    process_kinds=(("pipelines.platforms.tensorflow.launcher", "tf_launcher"),),
    strategy_note="every strategy but the default (MultiWorkerMirroredStrategy is synchronous data parallelism)",
))
