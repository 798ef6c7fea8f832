from notifyq.run.cli import main

main()
