"""Graph rewrites (rescale, reshard, re-parallelize): functions from graph to graph."""
