"""Pages: PLAN.md, the cross-op overview and the performance plots, from plans and results alone."""
