"""Data and component parallelism: the load-balancing slicer (slicer: BalancedBatchSampler, Shard,
ShardDataset, the cost model and partitioners), gradient sync over torch.distributed or stfast's NCCL
communicator (comm: GradientSync), the torch.distributed plumbing (data_parallel: DistInfo,
init_from_env, all_reduce_gradients, …) and component parallelism (components: ComponentPlan,
ComponentExecutor). Every name is importable from here; a submodule is imported when one of its names
is first used."""
from .._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "slicer": ("BalancedBatchSampler", "LinearCostModel", "Shard", "ShardDataset", "imbalance", "partition",
               "predicted_times", "profile_shards", "random_global_batches", "shard_features",
               "step_time_lower_bound"),
    "comm": ("REDUCE_OPS", "Bucket", "Communicator", "GradientSync", "NcclCommunicator", "TorchCommunicator", "Work",
             "assign_buckets", "make_communicator", "native_group", "nccl_available"),
    "data_parallel": ("DistInfo", "JoinFailure", "all_gather_floats", "all_reduce_gradients", "all_reduce_sum",
                      "broadcast_floats", "equal_shard", "init_from_env", "launched_by_torchrun", "shutdown"),
    "components": ("Component", "ComponentExecutor", "ComponentGraph", "ComponentPlan", "ParallelLayout",
                   "Placement", "StepResult", "cat_rows", "split_rows"),
})
