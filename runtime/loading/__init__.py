"""Loading, in three steps named by their files:

- `registered`: a registered model's files (the manifest seen as an FTW model and its side files);
- `read_ftw`: read FTW into memory (dense weights as compute tensors, experts as host banks);
- `runnable`: build a runnable model from a registered one (a family's model over the weights,
  experts behind the CPU or the hybrid GPU executor).

`registered` and `read_ftw` sit below the model families (which take ModelWeights); `runnable`
sits above them and the GPU runtime. The package itself imports nothing, so both directions hold.
"""
