"""The power-loss suite: checkpoint stores under simulated power cuts (LazyFS)."""
