//! Every native entry point of `weightlift._native` (each `#[pyfunction]`, each function of a `#[pymethods]`
//! block, each `Drop` of what the module owns) takes `bridge::keep_callers_context()` as its first statement, so that it holds the guard for its whole
//! duration: the caller's thread keeps its current CUDA context (torch's device) whatever the call binds there.
//! The two-GPU test of that behaviour is `tests/test_device_state.py`; this one runs anywhere.

use std::path::Path;

use syn::visit::Visit;

const GUARD: &str = "keep_callers_context";

fn has_attr(attrs: &[syn::Attribute], name: &str) -> bool {
    attrs.iter().any(|a| a.path().segments.last().is_some_and(|s| s.ident == name))
}

/// Whether `block` starts with `let _cuda = ...keep_callers_context();`.
fn starts_with_guard(block: &syn::Block) -> bool {
    let Some(syn::Stmt::Local(local)) = block.stmts.first() else { return false };
    let named = matches!(&local.pat, syn::Pat::Ident(p) if p.ident.to_string().starts_with('_'));
    let calls_guard = local.init.as_ref().is_some_and(|init| match &*init.expr {
        syn::Expr::Call(c) => {
            matches!(&*c.func, syn::Expr::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == GUARD))
        }
        _ => false,
    });
    named && calls_guard
}

#[derive(Default)]
struct EntryPoints {
    checked: Vec<String>,
    unguarded: Vec<String>,
}

impl EntryPoints {
    fn check(&mut self, name: String, block: &syn::Block) {
        if !starts_with_guard(block) {
            self.unguarded.push(name.clone());
        }
        self.checked.push(name);
    }
}

impl<'ast> Visit<'ast> for EntryPoints {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if has_attr(&f.attrs, "pyfunction") {
            self.check(f.sig.ident.to_string(), &f.block);
        }
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        // A Python object's drop runs on whatever thread frees it, the caller's: an entry point too.
        let is_drop = i.trait_.as_ref().is_some_and(|(_, t, _)| t.segments.last().is_some_and(|s| s.ident == "Drop"));
        if has_attr(&i.attrs, "pymethods") || is_drop {
            let ty = match &*i.self_ty {
                syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default(),
                _ => String::new(),
            };
            for item in &i.items {
                if let syn::ImplItem::Fn(f) = item {
                    self.check(format!("{ty}::{}", f.sig.ident), &f.block);
                }
            }
        }
        syn::visit::visit_item_impl(self, i);
    }
}

#[test]
fn every_entry_point_keeps_the_callers_cuda_context() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = EntryPoints::default();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let file = syn::parse_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
            found.visit_file(&file);
        }
    }
    // The reader must see the module's entry points, or it proves nothing.
    let known =
        ["probe", "NativeEngine::new", "NativeEngine::load_ranges", "NativeLayerStreamer::drop", "NativeStream::drop"];
    for known in known {
        assert!(found.checked.iter().any(|c| c == known), "{known} not found among {:?}", found.checked);
    }
    assert!(found.unguarded.is_empty(), "entry points without `let _cuda = {GUARD}();` first: {:?}", found.unguarded);
}
