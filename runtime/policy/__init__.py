"""What decides how expert-cache misses are served: the cache policies as plain simulators
(`expert_cache`: LRU and its rivals, replayed over routing), the offline references they are
judged against (`reference`: LFU, Belady's MIN), the q* split of one layer's misses between PCIe
and the CPU (`miss_split`, the cost model the GPU executor runs), and routing traces to replay
(`trace`). Plain Python and numpy: no torch, no GPU, nothing of the runtime that executes.
"""
