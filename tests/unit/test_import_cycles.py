"""No import circles anywhere in the package: not between siblings (lint-imports' acyclic_siblings
contract says that much), nor between a package and its own modules, nor across parts. A circle
means neither module can be read, tested or moved without the other, and its import order decides
which half sees the other half-built."""

import grimp


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's, iterative:
    an import chain may be deeper than the recursion limit likes), each sorted, in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, imported = work[-1]
            step = next(imported, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.find_modules_directly_imported_by(step)))))
                elif step in on_stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_a_circle_of_three_modules_is_found_and_a_chain_is_not():
    # Given a graph with a chain a -> b -> c and a circle x -> y -> z -> x
    graph = grimp.ImportGraph()
    for importer, imported in (("p.a", "p.b"), ("p.b", "p.c"), ("p.x", "p.y"), ("p.y", "p.z"), ("p.z", "p.x")):
        graph.add_import(importer=importer, imported=imported)
    # Then only the circle is reported
    assert circles(graph) == [["p.x", "p.y", "p.z"]]


def test_the_package_has_no_import_circles_type_checking_imports_included():
    # Given every import of notifyq, those under `if TYPE_CHECKING:` too (a circle a type
    # annotation needs is still two modules that know each other)
    graph = grimp.build_graph("notifyq", cache_dir=None)
    # Then no module reaches itself again through its imports
    assert circles(graph) == []
