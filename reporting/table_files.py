"""The files a result table writes into its folder (`table.make_table`,
`table_figures.draw_figures`)."""

TEXT_FILES = ("table.md", "table.csv", "summary.json")
ACCURACY_PNG = "top1_vs_sparsity.png"
LOSSES_PNG = "loss_curves.png"
GAPS_PNG = "gaps_to_dense.png"
MASKS_PNG = "masks.png"  # the student's 2:4 masks over training, where runs logged them
DIFFERENCES_PNG = "loss_differences.png"  # one row of loss differences per dense reference
FIGURE_FILES = (ACCURACY_PNG, LOSSES_PNG, GAPS_PNG, DIFFERENCES_PNG, MASKS_PNG)
