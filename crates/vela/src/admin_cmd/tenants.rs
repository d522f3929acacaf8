//! `vela admin tenants`: list, get, create, update, delete.

use clap::Subcommand;

use super::api::{Api, encode, print_json, split_list};

#[derive(Debug, Subcommand)]
pub(super) enum TenantsCmd {
    /// List tenants.
    List,
    /// Show a tenant's configuration.
    Get { tenant: String },
    /// Create a tenant.
    Create {
        tenant: String,
        /// Comma-separated admin roles.
        #[arg(short = 'r', long = "admin-roles", default_value = "")]
        admin_roles: String,
        /// Comma-separated allowed clusters.
        #[arg(short = 'c', long = "allowed-clusters", default_value = "standalone")]
        allowed_clusters: String,
    },
    /// Replace a tenant's admin roles and allowed clusters.
    Update {
        tenant: String,
        /// Comma-separated admin roles.
        #[arg(short = 'r', long = "admin-roles", default_value = "")]
        admin_roles: String,
        /// Comma-separated allowed clusters.
        #[arg(short = 'c', long = "allowed-clusters")]
        allowed_clusters: String,
    },
    /// Delete an empty tenant.
    Delete { tenant: String },
}

pub(super) fn tenants(api: &Api, cmd: TenantsCmd) -> anyhow::Result<()> {
    // pulsar-admin: create is PUT, update POST (same body).
    let method = if matches!(cmd, TenantsCmd::Create { .. }) {
        "PUT"
    } else {
        "POST"
    };
    match cmd {
        TenantsCmd::List => print_json(&api.get_json("/admin/v2/tenants")?),
        TenantsCmd::Get { tenant } => {
            print_json(&api.get_json(&format!("/admin/v2/tenants/{}", encode(&tenant)))?)
        }
        TenantsCmd::Create {
            tenant,
            admin_roles,
            allowed_clusters,
        }
        | TenantsCmd::Update {
            tenant,
            admin_roles,
            allowed_clusters,
        } => {
            let body = serde_json::json!({
                "adminRoles": split_list(&admin_roles),
                "allowedClusters": split_list(&allowed_clusters),
            });
            let path = format!("/admin/v2/tenants/{}", encode(&tenant));
            api.call(method, &path, Some(&body.to_string()))?;
            Ok(())
        }
        TenantsCmd::Delete { tenant } => {
            api.call(
                "DELETE",
                &format!("/admin/v2/tenants/{}", encode(&tenant)),
                None,
            )?;
            Ok(())
        }
    }
}
