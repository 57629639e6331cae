//! Every `extern "C"` function of the C API that can touch CUDA runs its work through `guard` (or `close`, which
//! calls it), which holds a `ContextRestore` for the call: the caller's thread keeps its current CUDA context
//! whatever the call binds there. The few that touch nothing but plain data are named below.

use std::path::Path;

use syn::visit::Visit;

/// Entry points that read plain data only (no CUDA, no drop of anything that owns CUDA state).
const PLAIN: &[&str] = &["wl_version", "wl_last_error", "wl_status_name", "wl_checkpoint_len", "wl_op_done"];

#[derive(Default)]
struct Calls(Vec<String>);

impl<'ast> Visit<'ast> for Calls {
    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        if let syn::Expr::Path(p) = &*c.func
            && let Some(s) = p.path.segments.last()
        {
            self.0.push(s.ident.to_string());
        }
        syn::visit::visit_expr_call(self, c);
    }
}

/// Whether `block` starts with `let _x = ...ContextRestore::save();`.
fn holds_a_context_restore(block: &syn::Block) -> bool {
    let Some(syn::Stmt::Local(local)) = block.stmts.first() else { return false };
    local.init.as_ref().is_some_and(|init| match &*init.expr {
        syn::Expr::Call(c) => matches!(&*c.func, syn::Expr::Path(p)
            if p.path.segments.iter().map(|s| s.ident.to_string()).collect::<Vec<_>>().ends_with(&["ContextRestore".into(), "save".into()])),
        _ => false,
    })
}

#[test]
fn every_entry_point_keeps_the_callers_cuda_context() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    let file = syn::parse_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let (mut checked, mut unguarded) = (Vec::new(), Vec::new());
    for item in &file.items {
        let syn::Item::Fn(f) = item else { continue };
        if f.sig.ident == "guard" {
            assert!(holds_a_context_restore(&f.block), "`guard` must take a ContextRestore first");
        }
        if f.sig.abi.is_none() {
            continue;
        }
        let name = f.sig.ident.to_string();
        checked.push(name.clone());
        if PLAIN.contains(&name.as_str()) {
            continue;
        }
        let mut calls = Calls::default();
        calls.visit_block(&f.block);
        if !calls.0.iter().any(|c| c == "guard" || c == "close") {
            unguarded.push(name);
        }
    }
    for known in ["wl_engine_open", "wl_engine_close", "wl_load_tensors", "wl_cuda_alloc", "wl_layers_load"] {
        assert!(checked.iter().any(|c| c == known), "{known} not found among {checked:?}");
    }
    for plain in PLAIN {
        assert!(checked.iter().any(|c| c == plain), "{plain} is no entry point any more: drop it from PLAIN");
    }
    assert!(unguarded.is_empty(), "entry points not running through guard: {unguarded:?}");
}
