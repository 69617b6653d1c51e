from memscope.cli import main

raise SystemExit(main())
