from topoprof.cli import main

main()
