//! Compiling one expression: parsing with optional syntax, and the checks that stand
//! in for Kubernetes' type checker (declared variables, a result that can be a bool, length).

use kube_cel::cel::common::ast::{EntryExpr, Expr, LiteralValue, operators};
use kube_cel::cel::parser::{Expression, Parser};

use super::ExpressionError;
use super::reads::{Footprint, Path, device_path};

/// Maximum length of an expression (Kubernetes' `CELSelectorExpressionMaxLength`, 10 Ki).
const EXPRESSION_MAX_LENGTH: usize = 10 * 1024;

/// Compile-checks one raw expression, e.g. to report it in a status.
pub fn check_expression(expression: &str) -> Result<(), ExpressionError> {
    compile_one(0, expression).map(|_| ())
}

pub(super) fn compile_one(
    index: usize,
    source: &str,
) -> Result<(Expression, Footprint), ExpressionError> {
    let invalid = |message: String| ExpressionError::Invalid {
        index,
        expression: source.to_owned(),
        message,
    };
    if source.len() > EXPRESSION_MAX_LENGTH {
        return Err(invalid(format!(
            "longer than {EXPRESSION_MAX_LENGTH} bytes"
        )));
    }
    // Optional syntax (`m.?x`, `m[?k]`) is on in the Kubernetes CEL base environment.
    let program = Parser::default()
        .enable_optional_syntax(true)
        .parse(source)
        .map_err(|e| invalid(format!("compilation failed: {e}")))?;
    let root = &program.expr;
    let mut bound = vec![];
    check_identifiers(root, &mut bound).map_err(invalid)?;
    if let Some(t) = non_bool_type(root) {
        return Err(invalid(format!("must evaluate to bool, not {t}")));
    }
    let fp = Footprint::of(root);
    Ok((program, fp))
}

/// Kubernetes' type checker rejects references to undeclared variables; the only variable of
/// the DRA environment is `device` (plus comprehension and `cel.bind` variables).
fn check_identifiers<'a>(expr: &'a Expr, bound: &mut Vec<&'a str>) -> Result<(), String> {
    match expr {
        Expr::Ident(name) => {
            if name == "device" || bound.contains(&name.as_str()) {
                Ok(())
            } else {
                Err(format!("undeclared reference to '{name}'"))
            }
        }
        Expr::Call(c) => {
            let is_bind = c.func_name == "bind"
                && matches!(c.target.as_deref().map(|t| &t.expr), Some(Expr::Ident(n)) if n == "cel");
            if is_bind {
                let [var, init, body] = c.args.as_slice() else {
                    return Err("cel.bind expects 3 arguments".to_owned());
                };
                let Expr::Ident(var) = &var.expr else {
                    return Err(
                        "cel.bind: the first argument must be a simple identifier".to_owned()
                    );
                };
                check_identifiers(&init.expr, bound)?;
                bound.push(var);
                let r = check_identifiers(&body.expr, bound);
                bound.pop();
                return r;
            }
            if let Some(t) = &c.target {
                // A namespaced function such as `optional.of` or `math.greatest` parses as a
                // call with an identifier target.
                let namespaced = matches!(&t.expr, Expr::Ident(n) if n == "optional" || n == "math" || n == "sets" || n == "strings" || n == "base64");
                if !namespaced {
                    check_identifiers(&t.expr, bound)?;
                }
            }
            c.args
                .iter()
                .try_for_each(|a| check_identifiers(&a.expr, bound))
        }
        Expr::Comprehension(c) => {
            check_identifiers(&c.iter_range.expr, bound)?;
            check_identifiers(&c.accu_init.expr, bound)?;
            let n = bound.len();
            bound.push(&c.iter_var);
            if let Some(v) = &c.iter_var2 {
                bound.push(v);
            }
            bound.push(&c.accu_var);
            let r = [&c.loop_cond, &c.loop_step, &c.result]
                .into_iter()
                .try_for_each(|e| check_identifiers(&e.expr, bound));
            bound.truncate(n);
            r
        }
        Expr::List(l) => l
            .elements
            .iter()
            .try_for_each(|e| check_identifiers(&e.expr, bound)),
        Expr::Map(m) => m.entries.iter().try_for_each(|e| match &e.expr {
            EntryExpr::MapEntry(m) => {
                check_identifiers(&m.key.expr, bound)?;
                check_identifiers(&m.value.expr, bound)
            }
            EntryExpr::StructField(f) => check_identifiers(&f.value.expr, bound),
        }),
        Expr::Struct(_) => {
            Err("message construction is not supported in the DRA environment".to_owned())
        }
        Expr::Select(s) => check_identifiers(&s.operand.expr, bound),
        Expr::Literal(_) | Expr::Unspecified => Ok(()),
    }
}

/// The result type of `expr` when it is certainly not bool (cel-rust has no type checker, so
/// only shapes whose type is evident are caught; the rest fails at evaluation).
fn non_bool_type(expr: &Expr) -> Option<&'static str> {
    if let Some(path) = device_path(expr) {
        return match path {
            Path::Device => Some("kubernetes.DRADevice"),
            Path::Map(_) | Path::Domain(..) => Some("map"),
            Path::Field("driver") => Some("string"),
            Path::Field(_) | Path::Leaf(..) => None,
        };
    }
    match expr {
        Expr::Literal(l) => match l {
            LiteralValue::Boolean(_) => None,
            LiteralValue::Bytes(_) => Some("bytes"),
            LiteralValue::Double(_) => Some("double"),
            LiteralValue::Int(_) => Some("int"),
            LiteralValue::Null => Some("null_type"),
            LiteralValue::String(_) => Some("string"),
            LiteralValue::UInt(_) => Some("uint"),
        },
        Expr::List(_) => Some("list"),
        Expr::Map(_) => Some("map"),
        Expr::Struct(_) => Some("message"),
        Expr::Call(c) => match c.func_name.as_str() {
            operators::ADD
            | operators::SUBSTRACT
            | operators::MULTIPLY
            | operators::DIVIDE
            | operators::MODULO => Some("a number, string or list"),
            operators::NEGATE => Some("a number"),
            "size" | "int" | "uint" | "double" | "compareTo" | "indexOf" | "lastIndexOf"
            | "sign" | "asInteger" | "major" | "minor" | "patch" => Some("a number"),
            "string" | "lowerAscii" | "upperAscii" | "trim" | "replace" | "substring"
            | "charAt" | "format" | "join" | "find" => Some("string"),
            "quantity" | "semver" | "add" | "sub" => Some("an opaque value"),
            "split" | "findAll" | "sort" | "reverse" => Some("list"),
            operators::CONDITIONAL => {
                let [_, a, b] = c.args.as_slice() else {
                    return None;
                };
                non_bool_type(&a.expr).and(non_bool_type(&b.expr))
            }
            _ => None,
        },
        Expr::Comprehension(_) | Expr::Ident(_) | Expr::Select(_) | Expr::Unspecified => None,
    }
}
