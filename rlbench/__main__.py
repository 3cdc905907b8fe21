from rlbench.cli import main

main()
