//! The kube-cel side: the shared root context with every kube-cel library and `cel.bind`, and
//! the parsing of versions and quantities into their kube-cel values.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use kube_cel::KubeCelExt;
use kube_cel::cel::common::ast::Expr;
use kube_cel::cel::{Context, FunctionContext, Program, ResolveResult, Value};

/// Distinct version/quantity strings whose parsed CEL value is remembered process-wide.
const PARSE_MEMO_CAPACITY: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum ParseKind {
    Semver,
    Quantity,
}

/// Parses a version (`semver(s)`, strict) or quantity (`quantity(s)`) through kube-cel,
/// remembering the few distinct strings a cluster has.
pub(super) fn parse_with_kube_cel(kind: ParseKind, s: &str) -> Result<Value, String> {
    type Memo = Mutex<HashMap<ParseKind, HashMap<String, Result<Value, String>>>>;
    static MEMO: OnceLock<Memo> = OnceLock::new();
    static PROGRAMS: OnceLock<Result<(Program, Program), String>> = OnceLock::new();
    let memo = MEMO.get_or_init(Default::default);
    if let Ok(m) = memo.lock()
        && let Some(r) = m.get(&kind).and_then(|m| m.get(s))
    {
        return r.clone();
    }
    let programs = PROGRAMS.get_or_init(|| {
        let semver = Program::compile("semver(s)").map_err(|e| e.to_string())?;
        let quantity = Program::compile("quantity(s)").map_err(|e| e.to_string())?;
        Ok((semver, quantity))
    });
    let result = match programs {
        Ok((semver, quantity)) => {
            let program = match kind {
                ParseKind::Semver => semver,
                ParseKind::Quantity => quantity,
            };
            let mut ctx = root_context().new_inner_scope();
            ctx.add_variable_from_value("s", Value::String(Arc::new(s.to_owned())));
            program.execute(&ctx).map_err(|e| e.to_string())
        }
        Err(e) => Err(e.clone()),
    };
    if let Ok(mut m) = memo.lock() {
        let m = m.entry(kind).or_default();
        if m.len() < PARSE_MEMO_CAPACITY {
            m.insert(s.to_owned(), result.clone());
        }
    }
    result
}

/// The shared root context: cel-rust's standard functions plus all kube-cel libraries and
/// `cel.bind`. Built once; evaluations use child scopes holding only `device`.
pub(super) fn root_context() -> &'static Context<'static> {
    static ROOT: OnceLock<Context<'static>> = OnceLock::new();
    ROOT.get_or_init(|| {
        let mut ctx = Context::default();
        ctx.register_all();
        ctx.add_function("cel.bind", cel_bind);
        ctx
    })
}

/// `cel.bind(name, init, body)`: `body` evaluated with `name` bound to `init`
/// (cel-go `ext.Bindings`, enabled in the DRA environment).
fn cel_bind(ftx: &FunctionContext) -> ResolveResult {
    let [name, init, body] = ftx.args else {
        return Err(ftx.error("cel.bind expects 3 arguments"));
    };
    let Expr::Ident(name) = &name.expr else {
        return Err(ftx.error("cel.bind: the first argument must be a simple identifier"));
    };
    let init = Value::resolve(init, ftx.ptx)?;
    let mut scope = ftx.ptx.new_inner_scope();
    scope.add_variable_from_value(name.clone(), init);
    Value::resolve(body, &scope)
}
