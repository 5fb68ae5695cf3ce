//! The generator of a VIP's settings. The settings are declared once, in
//! one table (`balancer-user/src/model/settings.rs`:
//! `balancer::vip_settings!`, a `macro_rules!` that hands the table to the
//! generator it is given), and
//! each generator here writes one face of them, in the module where that
//! face lives:
//!
//! - [`settings_state`]: the desired state's struct (`VipSettings`: the
//!   state file, the API's answers), its `Default`, its serde defaults
//!   and omissions, and `Setting`, the settings' names as data (the field
//!   path of an error);
//! - [`settings_file`]: the configuration file's `[[vip]]` entry
//!   (`VipEntry`): every setting a field of its own, so that serde can
//!   refuse an unknown key (it cannot through `#[serde(flatten)]`), with
//!   `settings()` and `of(..)` between it and the state's struct;
//! - [`settings_patch`]: the API's change of settings (`VipPatch`): every
//!   setting an `Option`, with `apply`;
//! - [`settings_cli`]: the flags of `vip add` and `vip set` (`VipArgs`),
//!   with `patch()`.
//!
//! A generator's input is `{ TARGET } TABLE`. TARGET is the struct to
//! write, as it is written (attributes, visibility, name, fields), with
//! `VIS ..` where the settings go (they take that visibility).
//!
//! TABLE is a header, then groups of settings:
//!
//! ```text
//! settings = PATH;             // the state's struct (for the other faces)
//! patch = PATH;                // the patch's struct (for the CLI)
//! order = [NAME, ...];         // the order of the state, the patch, the CLI
//! file_order = [NAME, ...];    // the order of the file's entry
//!
//! /// docs
//! group NAME {
//!     /// The setting's docs (the state's; any face's without its own).
//!     #[serde(with = "PATH")]          // optional: its encoding (the patch
//!                                      // takes PATH::option)
//!     #[schema(value_type = TYPE)]     // optional: its OpenAPI type
//!     #[omit_default]                  // optional: left out of the state's
//!                                      // and the file's form at its default
//!     NAME: TYPE = DEFAULT;
//!         file { /// docs  #[serde(..)] #[schema(..)] #[omit_default]  [= DEFAULT] }
//!         patch { /// docs  [TYPE] [=> |v[, old]| NEW_VALUE] }
//!         cli { /// docs  #[arg(..)]  TYPE [=> |args| PATCH_VALUE] }
//!
//!     /// A flag of the CLI alone (it shapes other settings' patch values).
//!     #[arg(..)]
//!     cli NAME: TYPE;
//! }
//! ```
//!
//! Every face block is optional: a face without its own docs takes the
//! setting's (but a flattened `#[command(flatten)]` flag), and a setting
//! without `cli` has no flag. The file's default is the state's unless its
//! block gives one; its attributes are added to the setting's (its `with`
//! replaces). The
//! patch's type is `Option<TYPE>` (`TYPE` itself when that is an
//! `Option`), and `apply` sets the value it holds (`Some(value)` for an
//! `Option` setting) unless the block says how (`v`: a reference to the
//! value the patch holds; `old`, if named, a reference to the setting's
//! value before the patch). The CLI's value for the patch is
//! `flag.map(Into::into)` unless the block says how (`args`: the flags).
//! The orders list the settings as they have always been written (state
//! files, API answers, `--help`, exported files read the same); a setting
//! they do not name follows them, in the table's order.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::{format_ident, quote};
use syn::{
    braced, bracketed,
    parse::{Parse, ParseStream},
    punctuated::Punctuated,
    Attribute, Expr, ExprClosure, Field, Ident, LitStr, Path, Token, Type, Visibility,
};

/// Writes the state's struct: the target with the settings' fields, its
/// `Default` (every setting's default) and the functions its serde
/// attributes name.
#[proc_macro]
pub fn settings_state(input: TokenStream) -> TokenStream {
    expand(input, state)
}

/// Writes the file's entry: the target with every setting a field of its
/// own, `settings()` (the state's struct it holds) and `of(..)` (an entry
/// of the target's other fields and a state's settings).
#[proc_macro]
pub fn settings_file(input: TokenStream) -> TokenStream {
    expand(input, file)
}

/// Writes the patch: the target with every setting an `Option`, and
/// `apply`.
#[proc_macro]
pub fn settings_patch(input: TokenStream) -> TokenStream {
    expand(input, patch)
}

/// Writes the CLI's flags: the target with the settings' flags, and
/// `patch()` (the patch they ask for).
#[proc_macro]
pub fn settings_cli(input: TokenStream) -> TokenStream {
    expand(input, cli)
}

fn expand(input: TokenStream, face: fn(&Target, &Table) -> syn::Result<Tokens>) -> TokenStream {
    let Input { target, table } = syn::parse_macro_input!(input as Input);
    face(&target, &table)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

// ---- What is read ----

struct Input {
    target: Target,
    table: Table,
}

impl Parse for Input {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let t;
        braced!(t in input);
        Ok(Input {
            target: t.parse()?,
            table: input.parse()?,
        })
    }
}

/// The struct a face is written into.
struct Target {
    attrs: Vec<Attribute>,
    vis: Visibility,
    name: Ident,
    /// Its fields before the settings.
    head: Vec<Field>,
    /// The settings' visibility.
    settings_vis: Visibility,
    /// Its fields after the settings.
    tail: Vec<Field>,
}

impl Parse for Target {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        input.parse::<Token![struct]>()?;
        let name: Ident = input.parse()?;
        let body;
        braced!(body in input);
        let (mut head, mut tail, mut settings_vis) = (Vec::new(), Vec::new(), None);
        while !body.is_empty() {
            let fork = body.fork();
            let vis: Visibility = fork.parse()?;
            if fork.peek(Token![..]) {
                if settings_vis.is_some() {
                    return Err(fork.error("the settings go in one place"));
                }
                body.parse::<Visibility>()?;
                body.parse::<Token![..]>()?;
                settings_vis = Some(vis);
            } else if settings_vis.is_none() {
                head.push(body.call(Field::parse_named)?);
            } else {
                tail.push(body.call(Field::parse_named)?);
            }
            if !body.is_empty() {
                body.parse::<Token![,]>()?;
            }
        }
        let settings_vis =
            settings_vis.ok_or_else(|| syn::Error::new(name.span(), "no `..` for the settings"))?;
        Ok(Target {
            attrs,
            vis,
            name,
            head,
            settings_vis,
            tail,
        })
    }
}

/// The table.
struct Table {
    /// The state's struct.
    settings: Path,
    /// The patch's struct.
    patch: Path,
    order: Vec<Ident>,
    file_order: Vec<Ident>,
    /// Every setting and CLI-only flag, in the table's order.
    items: Vec<Item>,
}

enum Item {
    Setting(Box<Setting>),
    CliOnly(Box<CliOnly>),
}

impl Item {
    fn name(&self) -> &Ident {
        match self {
            Item::Setting(s) => &s.name,
            Item::CliOnly(c) => &c.name,
        }
    }
}

/// A flag of the CLI alone.
struct CliOnly {
    attrs: Vec<Attribute>,
    name: Ident,
    ty: Type,
}

struct Setting {
    docs: Vec<Attribute>,
    /// Its encoding (`#[serde(with = ..)]`).
    with: Option<LitStr>,
    /// Its OpenAPI type (`#[schema(value_type = ..)]`).
    value_type: Option<Type>,
    omit_default: bool,
    name: Ident,
    ty: Type,
    default: Expr,
    file: FileFace,
    patch: PatchFace,
    cli: Option<CliFace>,
}

#[derive(Default)]
struct FileFace {
    docs: Vec<Attribute>,
    with: Option<LitStr>,
    value_type: Option<Type>,
    omit_default: bool,
    default: Option<Expr>,
}

#[derive(Default)]
struct PatchFace {
    docs: Vec<Attribute>,
    ty: Option<Type>,
    apply: Option<ExprClosure>,
}

struct CliFace {
    docs: Vec<Attribute>,
    /// `#[arg(..)]`, `#[command(..)]`.
    attrs: Vec<Attribute>,
    ty: Type,
    patch: Option<ExprClosure>,
}

/// The attributes a setting or its file face may carry, sorted.
#[derive(Default)]
struct Attrs {
    docs: Vec<Attribute>,
    with: Option<LitStr>,
    value_type: Option<Type>,
    omit_default: bool,
    /// Others (`arg`, `command`: the CLI's).
    other: Vec<Attribute>,
}

fn sort_attrs(attrs: Vec<Attribute>) -> syn::Result<Attrs> {
    let mut out = Attrs::default();
    for a in attrs {
        let p = a.path();
        if p.is_ident("doc") {
            out.docs.push(a);
        } else if p.is_ident("omit_default") {
            a.meta.require_path_only()?;
            out.omit_default = true;
        } else if p.is_ident("serde") {
            a.parse_nested_meta(|m| {
                if m.path.is_ident("with") {
                    out.with = Some(m.value()?.parse()?);
                    Ok(())
                } else {
                    Err(m.error(
                        "only `with` here: defaults are `= EXPR`, omissions #[omit_default]",
                    ))
                }
            })?;
        } else if p.is_ident("schema") {
            a.parse_nested_meta(|m| {
                if m.path.is_ident("value_type") {
                    out.value_type = Some(m.value()?.parse()?);
                    Ok(())
                } else {
                    Err(m.error("only `value_type` here"))
                }
            })?;
        } else {
            out.other.push(a);
        }
    }
    Ok(out)
}

fn no_other(a: &Attrs, what: &str) -> syn::Result<()> {
    match a.other.first() {
        Some(x) => Err(syn::Error::new_spanned(
            x,
            format!("{what} takes docs, #[serde(with)], #[schema(value_type)] and #[omit_default]"),
        )),
        None => Ok(()),
    }
}

impl Parse for Table {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let (mut settings, mut patch, mut order, mut file_order) = (None, None, None, None);
        let mut items = Vec::new();
        while !input.is_empty() {
            let attrs = input.call(Attribute::parse_outer)?;
            let key: Ident = input.parse()?;
            if key == "group" {
                // A group's docs are the reader's.
                let _name: Ident = input.parse()?;
                let body;
                braced!(body in input);
                while !body.is_empty() {
                    items.push(body.call(parse_item)?);
                }
                continue;
            }
            if !attrs.is_empty() {
                return Err(syn::Error::new(
                    key.span(),
                    "attributes before a header entry",
                ));
            }
            input.parse::<Token![=]>()?;
            match key.to_string().as_str() {
                "settings" => settings = Some(input.parse()?),
                "patch" => patch = Some(input.parse()?),
                "order" | "file_order" => {
                    let list;
                    bracketed!(list in input);
                    let names: Vec<Ident> =
                        Punctuated::<Ident, Token![,]>::parse_terminated(&list)?
                            .into_iter()
                            .collect();
                    if key == "order" {
                        order = Some(names);
                    } else {
                        file_order = Some(names);
                    }
                }
                _ => return Err(syn::Error::new(key.span(), "not a header entry")),
            }
            input.parse::<Token![;]>()?;
        }
        let missing = |what| syn::Error::new(input.span(), format!("the table has no `{what}`"));
        Ok(Table {
            settings: settings.ok_or_else(|| missing("settings"))?,
            patch: patch.ok_or_else(|| missing("patch"))?,
            order: order.unwrap_or_default(),
            file_order: file_order.unwrap_or_default(),
            items,
        })
    }
}

fn parse_item(input: ParseStream) -> syn::Result<Item> {
    let attrs = input.call(Attribute::parse_outer)?;
    if input.peek(Ident) && input.peek2(Ident) {
        let kw: Ident = input.parse()?;
        if kw != "cli" {
            return Err(syn::Error::new(
                kw.span(),
                "expected `cli NAME: TYPE;` or a setting",
            ));
        }
        let name = input.parse()?;
        input.parse::<Token![:]>()?;
        let ty = input.parse()?;
        input.parse::<Token![;]>()?;
        return Ok(Item::CliOnly(Box::new(CliOnly { attrs, name, ty })));
    }
    let a = sort_attrs(attrs)?;
    no_other(&a, "a setting")?;
    let name: Ident = input.parse()?;
    input.parse::<Token![:]>()?;
    let ty = input.parse()?;
    input.parse::<Token![=]>()?;
    let default = input.parse()?;
    input.parse::<Token![;]>()?;
    let mut s = Setting {
        docs: a.docs,
        with: a.with,
        value_type: a.value_type,
        omit_default: a.omit_default,
        name,
        ty,
        default,
        file: FileFace::default(),
        patch: PatchFace::default(),
        cli: None,
    };
    while input.peek(Ident) && input.peek2(syn::token::Brace) {
        let face: Ident = input.parse()?;
        let body;
        braced!(body in input);
        let a = sort_attrs(body.call(Attribute::parse_outer)?)?;
        match face.to_string().as_str() {
            "file" => {
                no_other(&a, "a file face")?;
                let default = if body.peek(Token![=]) {
                    body.parse::<Token![=]>()?;
                    Some(body.parse()?)
                } else {
                    None
                };
                s.file = FileFace {
                    docs: a.docs,
                    with: a.with,
                    value_type: a.value_type,
                    omit_default: a.omit_default,
                    default,
                };
            }
            "patch" => {
                if a.with.is_some() || a.value_type.is_some() || a.omit_default {
                    return Err(syn::Error::new(face.span(), "a patch face takes docs"));
                }
                no_other(&a, "a patch face")?;
                let ty = if body.is_empty() || body.peek(Token![=>]) {
                    None
                } else {
                    Some(body.parse()?)
                };
                s.patch = PatchFace {
                    docs: a.docs,
                    ty,
                    apply: arrow(&body)?,
                };
            }
            "cli" => {
                if a.with.is_some() || a.value_type.is_some() || a.omit_default {
                    return Err(syn::Error::new(
                        face.span(),
                        "a CLI face takes docs and #[arg]",
                    ));
                }
                let ty = body.parse()?;
                let patch = arrow(&body)?;
                if let Some(c) = patch.as_ref().filter(|c| c.inputs.len() != 1) {
                    return Err(syn::Error::new_spanned(
                        &c.inputs,
                        "one argument: the flags",
                    ));
                }
                s.cli = Some(CliFace {
                    docs: a.docs,
                    attrs: a.other,
                    ty,
                    patch,
                });
            }
            _ => {
                return Err(syn::Error::new(
                    face.span(),
                    "expected `file`, `patch` or `cli`",
                ))
            }
        }
        if !body.is_empty() {
            return Err(body.error("unexpected tokens in the face"));
        }
    }
    Ok(Item::Setting(Box::new(s)))
}

/// `=> |x| EXPR`, if there.
fn arrow(input: ParseStream) -> syn::Result<Option<ExprClosure>> {
    if input.peek(Token![=>]) {
        input.parse::<Token![=>]>()?;
        let c: ExprClosure = input.parse()?;
        if !(1..=2).contains(&c.inputs.len()) {
            return Err(syn::Error::new_spanned(
                &c.inputs,
                "one argument (a patch's: two, the second the setting's current value)",
            ));
        }
        Ok(Some(c))
    } else {
        Ok(None)
    }
}

impl Table {
    /// The items in `list`'s order, then the others in the table's.
    fn ordered<'a>(&'a self, list: &[Ident]) -> syn::Result<Vec<&'a Item>> {
        let mut out: Vec<&Item> = Vec::new();
        for n in list {
            let Some(i) = self.items.iter().find(|i| i.name() == n) else {
                return Err(syn::Error::new(n.span(), "no such setting"));
            };
            if out.iter().any(|o| o.name() == n) {
                return Err(syn::Error::new(n.span(), "listed twice"));
            }
            out.push(i);
        }
        for i in &self.items {
            if !out.iter().any(|o| o.name() == i.name()) {
                out.push(i);
            }
        }
        Ok(out)
    }

    fn settings_in(&self, list: &[Ident]) -> syn::Result<Vec<&Setting>> {
        Ok(self
            .ordered(list)?
            .into_iter()
            .filter_map(|i| match i {
                Item::Setting(s) => Some(&**s),
                Item::CliOnly(_) => None,
            })
            .collect())
    }

    /// The settings in the table's order (for struct literals).
    fn settings(&self) -> impl Iterator<Item = &Setting> {
        self.items.iter().filter_map(|i| match i {
            Item::Setting(s) => Some(&**s),
            Item::CliOnly(_) => None,
        })
    }

    fn check_names(&self) -> syn::Result<()> {
        for (k, i) in self.items.iter().enumerate() {
            if self.items[..k].iter().any(|o| o.name() == i.name()) {
                return Err(syn::Error::new(i.name().span(), "declared twice"));
            }
        }
        Ok(())
    }
}

// ---- What is written ----

/// The target struct with `settings` (already written fields) in its
/// `..`.
fn write_struct(t: &Target, settings: &[Tokens]) -> Tokens {
    let Target {
        attrs,
        vis,
        name,
        head,
        tail,
        ..
    } = t;
    quote! {
        #(#attrs)*
        #vis struct #name {
            #(#head,)*
            #(#settings)*
            #(#tail,)*
        }
    }
}

/// `Option<T>`: its `T`.
fn option_inner(ty: &Type) -> Option<&Type> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Option" {
        return None;
    }
    match &last.arguments {
        syn::PathArguments::AngleBracketed(a) if a.args.len() == 1 => match &a.args[0] {
            syn::GenericArgument::Type(t) => Some(t),
            _ => None,
        },
        _ => None,
    }
}

/// `T`, as an `Option` (itself when it is one).
fn optional(ty: &Type) -> Tokens {
    if option_inner(ty).is_some() {
        quote!(#ty)
    } else {
        quote!(::core::option::Option<#ty>)
    }
}

/// The serde attributes naming a face's default and omission functions
/// (`Name::serde_default_x`, `Name::serde_omit_x`), and those functions.
fn defaults(
    target: &Ident,
    name: &Ident,
    ty: &Type,
    default: &Tokens,
    omit: bool,
) -> (Tokens, Tokens) {
    let d = format_ident!("serde_default_{}", name);
    let o = format_ident!("serde_omit_{}", name);
    let d_path = LitStr::new(&format!("{target}::{d}"), name.span());
    let o_path = LitStr::new(&format!("{target}::{o}"), name.span());
    let mut attr = quote!(#[serde(default = #d_path)]);
    let mut fns = quote! {
        #[doc(hidden)]
        fn #d() -> #ty {
            #default
        }
    };
    if omit {
        attr.extend(quote!(#[serde(skip_serializing_if = #o_path)]));
        fns.extend(quote! {
            #[doc(hidden)]
            fn #o(v: &#ty) -> bool {
                *v == Self::#d()
            }
        });
    }
    (attr, fns)
}

fn with_attr(with: &Option<LitStr>) -> Tokens {
    with.as_ref()
        .map(|w| quote!(#[serde(with = #w)]))
        .unwrap_or_default()
}

fn schema_attr(vt: &Option<Type>) -> Tokens {
    vt.as_ref()
        .map(|t| quote!(#[schema(value_type = #t)]))
        .unwrap_or_default()
}

fn state(t: &Target, table: &Table) -> syn::Result<Tokens> {
    table.check_names()?;
    let name = &t.name;
    let vis = &t.settings_vis;
    let (mut fields, mut fns, mut inits) = (Vec::new(), Vec::new(), Vec::new());
    for s in table.settings_in(&table.order)? {
        let Setting {
            docs,
            name: f,
            ty,
            default,
            ..
        } = s;
        let (attr, f_fns) = defaults(name, f, ty, &quote!(#default), s.omit_default);
        let (with, schema) = (with_attr(&s.with), schema_attr(&s.value_type));
        fields.push(quote! {
            #(#docs)*
            #attr
            #with
            #schema
            #vis #f: #ty,
        });
        fns.push(f_fns);
        let d = format_ident!("serde_default_{}", f);
        inits.push(quote!(#f: Self::#d(),));
    }
    let s = write_struct(t, &fields);
    let names = setting_names(table, vis)?;
    Ok(quote! {
        #s
        #names
        impl #name {
            #(#fns)*
        }
        impl ::core::default::Default for #name {
            fn default() -> Self {
                Self { #(#inits)* }
            }
        }
    })
}

/// `Setting`: every setting's name as data, in the table's order (an
/// error's field path names a setting by it, so that no name is written
/// twice).
fn setting_names(table: &Table, vis: &Visibility) -> syn::Result<Tokens> {
    let (mut variants, mut arms, mut all) = (Vec::new(), Vec::new(), Vec::new());
    for s in table.settings_in(&table.order)? {
        let key = s.name.to_string();
        let camel: String = key
            .split('_')
            .map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect();
        let v = Ident::new(&camel, s.name.span());
        let doc = format!("`{key}`.");
        variants.push(quote!(#[doc = #doc] #v,));
        arms.push(quote!(Setting::#v => #key,));
        all.push(quote!(Setting::#v,));
    }
    Ok(quote! {
        /// A VIP setting's name, as data: its key in the state, the
        /// configuration file and the API (the table's name).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #vis enum Setting {
            #(#variants)*
        }
        impl Setting {
            /// Every setting, in the state's order.
            #vis const ALL: &'static [Setting] = &[#(#all)*];
            /// The setting's key (`choices`, `health`, `source_rate`).
            #vis const fn name(self) -> &'static str {
                match self {
                    #(#arms)*
                }
            }
        }
        impl ::core::fmt::Display for Setting {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(self.name())
            }
        }
    })
}

fn file(t: &Target, table: &Table) -> syn::Result<Tokens> {
    table.check_names()?;
    let name = &t.name;
    let vis = &t.settings_vis;
    let settings = &table.settings;
    let (mut fields, mut fns) = (Vec::new(), Vec::new());
    for s in table.settings_in(&table.file_order)? {
        let Setting { name: f, ty, .. } = s;
        let face = &s.file;
        let docs = if face.docs.is_empty() {
            &s.docs
        } else {
            &face.docs
        };
        let default = match &face.default {
            Some(e) => quote!(#e),
            None => quote!(<#settings as ::core::default::Default>::default().#f),
        };
        let omit = s.omit_default || face.omit_default;
        let (attr, f_fns) = defaults(name, f, ty, &default, omit);
        let with = with_attr(face.with.as_ref().map_or(&s.with, |_| &face.with));
        let schema = schema_attr(
            face.value_type
                .as_ref()
                .map_or(&s.value_type, |_| &face.value_type),
        );
        fields.push(quote! {
            #(#docs)*
            #attr
            #with
            #schema
            #vis #f: #ty,
        });
        fns.push(f_fns);
    }
    let names: Vec<&Ident> = table.settings().map(|s| &s.name).collect();
    let head: Vec<&Ident> = t.head.iter().filter_map(|f| f.ident.as_ref()).collect();
    let tail: Vec<&Ident> = t.tail.iter().filter_map(|f| f.ident.as_ref()).collect();
    let head_ty = t.head.iter().map(|f| &f.ty);
    let tail_ty = t.tail.iter().map(|f| &f.ty);
    let s = write_struct(t, &fields);
    Ok(quote! {
        #s
        impl #name {
            #(#fns)*

            /// The VIP's settings.
            #[allow(clippy::clone_on_copy)]
            pub fn settings(&self) -> #settings {
                #settings {
                    #(#names: self.#names.clone(),)*
                }
            }

            #[allow(clippy::clone_on_copy)]
            fn of(
                #(#head: #head_ty,)*
                settings: &#settings,
                #(#tail: #tail_ty,)*
            ) -> Self {
                Self {
                    #(#head,)*
                    #(#names: settings.#names.clone(),)*
                    #(#tail,)*
                }
            }
        }
    })
}

fn patch(t: &Target, table: &Table) -> syn::Result<Tokens> {
    table.check_names()?;
    let name = &t.name;
    let vis = &t.settings_vis;
    let settings = &table.settings;
    let (mut fields, mut applies) = (Vec::new(), Vec::new());
    for s in table.settings_in(&table.order)? {
        let Setting { name: f, ty, .. } = s;
        let face = &s.patch;
        let docs = if face.docs.is_empty() {
            &s.docs
        } else {
            &face.docs
        };
        let pty = match &face.ty {
            Some(t) => optional(t),
            None => optional(ty),
        };
        let with = s.with.as_ref().map(|w| {
            let w = LitStr::new(&format!("{}::option", w.value()), w.span());
            quote!(#[serde(with = #w)])
        });
        let schema = s.value_type.as_ref().map(|v| {
            let v = optional(v);
            quote!(#[schema(value_type = #v)])
        });
        fields.push(quote! {
            #(#docs)*
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #with
            #schema
            #vis #f: #pty,
        });
        applies.push(match &face.apply {
            Some(c) if c.inputs.len() == 2 => {
                let (v, old, body) = (&c.inputs[0], &c.inputs[1], &c.body);
                quote! {
                    if let ::core::option::Option::Some(#v) = &self.#f {
                        let #old = &settings.#f;
                        s.#f = #body;
                    }
                }
            }
            Some(c) => {
                let (v, body) = (&c.inputs[0], &c.body);
                quote! {
                    if let ::core::option::Option::Some(#v) = &self.#f {
                        s.#f = #body;
                    }
                }
            }
            None if face.ty.is_none() && option_inner(ty).is_some() => quote! {
                if let ::core::option::Option::Some(v) = &self.#f {
                    s.#f = ::core::option::Option::Some(v.clone());
                }
            },
            None => quote! {
                if let ::core::option::Option::Some(v) = &self.#f {
                    s.#f = v.clone();
                }
            },
        });
    }
    let st = write_struct(t, &fields);
    Ok(quote! {
        #st
        impl #name {
            /// `settings` with this patch applied.
            #[allow(clippy::clone_on_copy)]
            pub fn apply(&self, settings: &#settings) -> #settings {
                let mut s = settings.clone();
                #(#applies)*
                s
            }
        }
    })
}

fn cli(t: &Target, table: &Table) -> syn::Result<Tokens> {
    table.check_names()?;
    let name = &t.name;
    let vis = &t.settings_vis;
    let patch = &table.patch;
    let mut fields = Vec::new();
    for i in table.ordered(&table.order)? {
        match i {
            Item::CliOnly(c) => {
                let CliOnly { attrs, name: f, ty } = &**c;
                fields.push(quote! {
                    #(#attrs)*
                    #vis #f: #ty,
                });
            }
            Item::Setting(s) => {
                let Some(c) = &s.cli else { continue };
                let f = &s.name;
                let flattened = c.attrs.iter().any(|a| a.path().is_ident("command"));
                let docs = if c.docs.is_empty() && !flattened {
                    &s.docs
                } else {
                    &c.docs
                };
                let (attrs, ty) = (&c.attrs, &c.ty);
                fields.push(quote! {
                    #(#docs)*
                    #(#attrs)*
                    #vis #f: #ty,
                });
            }
        }
    }
    let values = table.settings().map(|s| {
        let f = &s.name;
        match &s.cli {
            None => quote!(#f: ::core::option::Option::None,),
            Some(CliFace { patch: None, .. }) => {
                quote!(#f: self.#f.clone().map(::core::convert::Into::into),)
            }
            Some(CliFace { patch: Some(c), .. }) => {
                let (a, body) = (&c.inputs[0], &c.body);
                quote!(#f: { let #a = self; #body },)
            }
        }
    });
    let st = write_struct(t, &fields);
    Ok(quote! {
        #st
        impl #name {
            /// The change of settings the flags ask for.
            #[allow(clippy::clone_on_copy, clippy::useless_conversion)]
            fn patch(&self) -> #patch {
                #patch {
                    #(#values)*
                }
            }
        }
    })
}
