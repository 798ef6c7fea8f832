from notifyq.cli import main

main()
