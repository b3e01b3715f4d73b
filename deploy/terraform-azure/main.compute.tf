# Compute: one VM per party (Alice, Bob, Carol, optionally Dave) and one VM for the
# dealer-gateway. Each VM runs exactly one container (see templates/cloud-init.yaml.tftpl).
# Parties have no public IP; the gateway has one, reachable on HTTPS from
# allowed_https_cidrs only.

locals {
  ubuntu = {
    publisher = "Canonical"
    offer     = "ubuntu-24_04-lts"
    sku       = "server"
    version   = "latest"
  }

  party_cloud_init = {
    for name, p in local.parties : name => templatefile("${path.module}/templates/cloud-init.yaml.tftpl", {
      role             = "party"
      name             = name
      image            = var.party_image
      secret_name      = "${var.secret_prefix}-${name}"
      key_vault_uri    = local.key_vault_uri
      acr_login_server = local.acr_login_server
      # host network: the MPC port is bound on the VM's private IP 1:1, as MP-SPDZ needs
      docker_args = join(" ", [
        "--network host",
        "-e PPFS_SECURITY=${var.security}",
        "-e PPFS_SECRETS_DIR=/run/secrets/ppfs",
      ])
      command = join(" ", [
        "party serve --state-dir /var/lib/ppfs/state --index ${p.index}",
        "--listen 0.0.0.0:${var.grpc_port}",
        "--mpc-host ${p.private_ip} --mpc-port ${p.mpc_port}",
        "--mpc-port-count ${var.mpc_ports_per_party}",
      ])
    })
  }

  gateway_cloud_init = templatefile("${path.module}/templates/cloud-init.yaml.tftpl", {
    role             = "gateway"
    name             = "gateway"
    image            = var.gateway_image
    secret_name      = "${var.secret_prefix}-gateway"
    key_vault_uri    = local.key_vault_uri
    acr_login_server = local.acr_login_server
    # The gateway's party addresses, certificates and tokens come from its secret folder
    # (deploy/compose/make-secrets.sh --no-gateway-keys --party-host <party_private_ips>);
    # its private keys it makes itself, in its state volume, at its first start
    # (--make-keys), and waits for their certificates (its service retries every 10 s).
    docker_args = join(" ", [
      "-p ${var.gateway_https_port}:8080",
      "-e PPFS_SECURITY=${var.security}",
    ])
    # --require-https: a folder made without --https-name stops it, rather than have it
    # take bearer tokens over plain HTTP from the Internet
    command = "gateway serve --config /run/secrets/ppfs/gateway.json --make-keys --require-https --host 0.0.0.0 --port 8080"
  })
}

resource "azurerm_network_interface" "party" {
  for_each = local.parties

  name                           = "${var.name_prefix}-${each.key}-nic"
  location                       = var.location
  resource_group_name            = var.resource_group_name
  accelerated_networking_enabled = false
  ip_forwarding_enabled          = false
  tags                           = local.common_tags

  ip_configuration {
    name                          = "internal"
    subnet_id                     = azurerm_subnet.parties.id
    private_ip_address_allocation = "Static"
    private_ip_address            = each.value.private_ip
  }
}

resource "azurerm_linux_virtual_machine" "party" {
  for_each = local.parties

  name                            = "${var.name_prefix}-${each.key}"
  location                        = var.location
  resource_group_name             = var.resource_group_name
  size                            = var.party_vm_size
  admin_username                  = var.admin_username
  disable_password_authentication = true
  allow_extension_operations      = false
  provision_vm_agent              = true
  encryption_at_host_enabled      = true
  network_interface_ids           = [azurerm_network_interface.party[each.key].id]
  custom_data                     = base64encode(local.party_cloud_init[each.key])
  tags                            = merge(local.common_tags, { "ppfs-party" = each.key })

  # the party's own administrator where one is given: no one key opens every party's VM
  admin_ssh_key {
    username   = var.admin_username
    public_key = lookup(var.party_admin_ssh_public_keys, each.key, var.admin_ssh_public_key)
  }

  # The serial console log, read through the Azure API (`az vm boot-diagnostics
  # get-boot-log`), carries the SSH host keys cloud-init prints at first boot: the one
  # channel to a party VM that does not pass through the gateway's VM, which SSH to a
  # party jumps through. The operator pins them before fetching a key request.
  boot_diagnostics {}

  identity {
    type = "SystemAssigned"
  }

  os_disk {
    name                 = "${var.name_prefix}-${each.key}-os"
    caching              = "ReadWrite"
    storage_account_type = "Premium_LRS"
  }

  source_image_reference {
    publisher = local.ubuntu.publisher
    offer     = local.ubuntu.offer
    sku       = local.ubuntu.sku
    version   = local.ubuntu.version
  }
}

resource "azurerm_public_ip" "gateway" {
  name                = "${var.name_prefix}-gateway-pip"
  location            = var.location
  resource_group_name = var.resource_group_name
  allocation_method   = "Static"
  sku                 = "Standard"
  zones               = ["1", "2", "3"]
  # <label>.<location>.cloudapp.azure.com: known before apply, so the gateway's HTTPS
  # certificate (make-secrets.sh --https-name) can be issued before the VM boots
  domain_name_label = local.gateway_dns_label
  tags              = local.common_tags
}

resource "azurerm_network_interface" "gateway" {
  #checkov:skip=CKV_AZURE_119:The gateway is the deployment's only public endpoint; its NSG admits HTTPS from allowed_https_cidrs only.
  name                           = "${var.name_prefix}-gateway-nic"
  location                       = var.location
  resource_group_name            = var.resource_group_name
  accelerated_networking_enabled = false
  ip_forwarding_enabled          = false
  tags                           = local.common_tags

  ip_configuration {
    name                          = "public"
    subnet_id                     = azurerm_subnet.gateway.id
    private_ip_address_allocation = "Static"
    private_ip_address            = local.gateway_ip
    public_ip_address_id          = azurerm_public_ip.gateway.id
  }
}

resource "azurerm_linux_virtual_machine" "gateway" {
  name                            = "${var.name_prefix}-gateway"
  location                        = var.location
  resource_group_name             = var.resource_group_name
  size                            = var.gateway_vm_size
  admin_username                  = var.admin_username
  disable_password_authentication = true
  allow_extension_operations      = false
  provision_vm_agent              = true
  encryption_at_host_enabled      = true
  network_interface_ids           = [azurerm_network_interface.gateway.id]
  custom_data                     = base64encode(local.gateway_cloud_init)
  tags                            = merge(local.common_tags, { "ppfs-role" = "gateway" })

  # the operator's key, and each party administrator's: SSH to a party jumps through here
  dynamic "admin_ssh_key" {
    for_each = toset(concat([var.admin_ssh_public_key], values(var.party_admin_ssh_public_keys)))
    content {
      username   = var.admin_username
      public_key = admin_ssh_key.value
    }
  }

  # The serial console log, read through the Azure API (`az vm boot-diagnostics
  # get-boot-log`), carries the SSH host keys cloud-init prints at first boot: the one
  # channel to a party VM that does not pass through the gateway's VM, which SSH to a
  # party jumps through. The operator pins them before fetching a key request.
  boot_diagnostics {}

  identity {
    type = "SystemAssigned"
  }

  os_disk {
    name                 = "${var.name_prefix}-gateway-os"
    caching              = "ReadWrite"
    storage_account_type = "Premium_LRS"
  }

  source_image_reference {
    publisher = local.ubuntu.publisher
    offer     = local.ubuntu.offer
    sku       = local.ubuntu.sku
    version   = local.ubuntu.version
  }
}
