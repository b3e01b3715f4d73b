# Identity: each VM's system-assigned identity may read exactly ONE Key Vault secret, its
# own (role assignment scoped to that secret), and pull from the registry if acr_id is set.
# Terraform references the secrets by name only and never reads their values, so no
# secret ends up in the state.

locals {
  vm_principals = merge(
    { for name, vm in azurerm_linux_virtual_machine.party : name => vm.identity[0].principal_id },
    { gateway = azurerm_linux_virtual_machine.gateway.identity[0].principal_id },
  )
}

resource "azurerm_role_assignment" "own_secret" {
  for_each = local.vm_principals

  scope                = "${var.key_vault_id}/secrets/${var.secret_prefix}-${each.key}"
  role_definition_name = "Key Vault Secrets User"
  principal_id         = each.value
  principal_type       = "ServicePrincipal"
  description          = "ppfs ${each.key}: read its own secret folder, nothing else"
}

resource "azurerm_role_assignment" "acr_pull" {
  for_each = var.acr_id == null ? {} : local.vm_principals

  scope                = var.acr_id
  role_definition_name = "AcrPull"
  principal_id         = each.value
  principal_type       = "ServicePrincipal"
  description          = "ppfs ${each.key}: pull the ppfs images"
}
