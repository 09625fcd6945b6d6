"""Result records, the results file and merging results from several machines. Plain Python."""
