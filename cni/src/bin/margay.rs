//! `margay`: the CNI plugins' program. Started as `margay` it is the main plugin; started as
//! `margay-ipam` (a copy or a link) it is the IPAM plugin.

fn main() {
    let argv0 = std::env::args_os()
        .next()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    std::process::exit(cni::run(cni::Plugin::from_argv0(&argv0)));
}
