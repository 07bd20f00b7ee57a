"""What the chapters call but do not teach: the course's helpers, apart from the textbook.

``ls minikv/`` lists the code the chapters teach (the managers, the pool, the storage, the
kernels, the engine, the models). The modules here serve the lessons around it:

* :mod:`minikv.course.demo`: small helpers the chapters' cells call (a server to play with, a
  listing of the package's own source, a table, a printed error, the glue of a number into the
  text);
* :mod:`minikv.course.vocab`: a toy vocabulary, so a tree can be drawn with words, not ids;
* :mod:`minikv.course.workloads`: seeded request streams shaped like real traffic (shared system
  prompts, multi-turn chats, few-shot prompts) and their offline optimum.
"""
